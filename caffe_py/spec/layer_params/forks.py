"""Layer types that are not BVLC Caffe's: where each comes from, for the error about a type
caffe-py lacks and for docs/layers.md's table of the fork types it has.

Prototxts from public Caffe projects often use types that only a project's own fork of Caffe
registers (SSD's PriorBox, SegNet's BN, Faster R-CNN's ROIPooling...). Naming the fork tells
the user why the net does not build, where a did-you-mean toward a BVLC type would mislead.
caffe-py has some of these types (the spec's LAYER_PARAMS declares them; the table still says
whose they are); the error is only ever raised for the others.

FORKS lists, per fork, the types its sources register (``REGISTER_LAYER_CLASS`` /
``REGISTER_LAYER_CREATOR`` beyond BVLC's), read from each repository: weiliu89/caffe (branch
ssd), alexgkendall/caffe-segnet, rbgirshick/caffe-fast-rcnn (branch faster-rcnn) and
ShaoqingRen/caffe, daijifeng001/caffe-rfcn, hszhao/PSPNet, DeepLab v2 (deeplab-public-ver2),
NVIDIA/caffe, intel/caffe, CMU-Perceptual-Computing-Lab/caffe_train and caffe_rtpose,
lmb-freiburg/flownet2, wy1iu/sphereface, ydwen/caffe-face, happynear/caffe-windows (AM-Softmax),
farmingyard/ShuffleNet and caffe-mobilenet, hujie-frank/SENet, senlinuc/caffe_ocr (CRNN),
yonghenglh6/DepthwiseConvolution and eric612/MobileNet-YOLO.
"""
from __future__ import annotations

# BVLC Caffe 1.0's own types (src/caffe/layers and layer_factory.cpp).
BVLC_TYPES = frozenset((
    "AbsVal Accuracy ArgMax BNLL BatchNorm BatchReindex Bias Clip Concat ContrastiveLoss "
    "Convolution Crop Data Deconvolution Dropout DummyData ELU Eltwise Embed EuclideanLoss Exp "
    "Filter Flatten HDF5Data HDF5Output HingeLoss Im2col ImageData InfogainLoss InnerProduct "
    "Input LRN LSTM LSTMUnit Log MVN MemoryData MultinomialLogisticLoss PReLU Parameter "
    "Pooling Power Python RNN ReLU Reduction Reshape SPP Scale Sigmoid "
    "SigmoidCrossEntropyLoss Silence Slice Softmax SoftmaxWithLoss Split Swish TanH Threshold "
    "Tile WindowData").split())

# Fork -> the types it adds, in the order the error names forks.
FORKS: dict[str, tuple[str, ...]] = {
    "SSD": ("AnnotatedData", "DetectionEvaluate", "DetectionOutput", "MultiBoxLoss",
            "Normalize", "Permute", "PriorBox", "SmoothL1Loss", "VideoData"),
    "SegNet": ("BN", "DenseImageData", "Upsample"),
    "Fast/Faster R-CNN": ("ROIPooling", "SmoothL1Loss"),
    "R-FCN": ("PSROIPooling", "BoxAnnotatorOHEM", "ROIPooling", "SmoothL1Loss"),
    "PSPNet": ("AdaptiveBiasChannel", "BN", "BiasChannel", "DenseCRF", "DomainTransform",
               "DomainTransformForwardOnly", "ImageSegData", "Interp", "MatRead", "MatWrite",
               "SegAccuracy", "SpatialProduct", "UniqueLabel"),
    "DeepLab v2": ("AdaptiveBiasChannel", "BiasChannel", "DenseCRF", "DomainTransform",
                   "DomainTransformForwardOnly", "ImageSegData", "Interp", "MatRead",
                   "MatWrite", "SegAccuracy", "SpatialProduct", "UniqueLabel"),
    "OpenPose (CPM)": ("CPMData", "ImResize", "Nms", "Maximum", "EuclideanmaskLoss"),
    "FlowNet 2.0": ("Accum", "BlackAugmentation", "ChannelNorm", "Correlation",
                    "Correlation1D", "CustomData", "DataAugmentation", "DisparityData",
                    "Downsample", "FLOWriter", "FloatReader", "FloatWriter",
                    "FlowAugmentation", "FlowWarp", "GenerateAugmentationParameters",
                    "ImgReader", "ImgWriter", "L1Loss", "LpqLoss", "Mean", "NegReLU",
                    "PFMWriter", "Resample"),
    "NVIDIA (NVCaffe)": ("Axpy", "DetectNetTransformation", "DetectionEvaluate",
                         "DetectionOutput", "L1Loss", "MultiBoxLoss", "Normalize", "Permute",
                         "PriorBox", "SmoothL1Loss", "TRT"),
    "Intel": ("AnnotatedData", "Axpy", "BoxAnnotatorOHEM", "BoxData", "DetectionEvaluate",
              "DetectionOutput", "EvalDetection", "MKLBatchNorm", "MnActivation",
              "MultiBoxLoss", "Normalize", "PSROIPooling", "Permute", "PriorBox", "ROIPooling",
              "RegionLoss", "Reorg", "SmoothL1Loss", "SmoothL1LossOHEM", "SoftmaxWithLossOHEM",
              "SpatialDropout", "VideoData"),
    "SphereFace": ("MarginInnerProduct",),
    "center-loss (caffe-face)": ("CenterLoss",),
    "AM-Softmax": ("LabelSpecificAdd",),
    "ShuffleNet": ("ShuffleChannel",),
    "caffe-mobilenet": ("ConvolutionDepthwise",),
    "SENet": ("Axpy",),
    "DepthwiseConvolution": ("DepthwiseConvolution",),
    "caffe_ocr (CRNN)": ("CTCGreedyDecoder", "Lstm", "Reverse", "ReverseTime", "Transpose",
                         "WarpCTCLoss"),
    "MobileNet-YOLO": ("AnnotatedData", "AssistedExcitation", "Axpy", "DepthwiseConvolution",
                       "DetectionEvaluate", "DetectionOutput", "GaussianYolov3", "LaneData",
                       "MultiBoxLoss", "Normalize", "Permute", "PriorBox", "ReLU6",
                       "RegionLoss", "Reorg", "SegmentationEvaluate", "SmoothL1Loss",
                       "Upsample", "YoloDetectionOutput", "YoloSeg", "Yolov3",
                       "Yolov3DetectionOutput"),
}

# Fork -> the repository its sources were read from (for the docs).
REPOSITORIES: dict[str, str] = {
    "SSD": "weiliu89/caffe (ssd)", "SegNet": "alexgkendall/caffe-segnet",
    "Fast/Faster R-CNN": "rbgirshick/caffe-fast-rcnn", "R-FCN": "daijifeng001/caffe-rfcn",
    "PSPNet": "hszhao/PSPNet", "DeepLab v2": "deeplab-public-ver2",
    "OpenPose (CPM)": "CMU-Perceptual-Computing-Lab/caffe_train",
    "FlowNet 2.0": "lmb-freiburg/flownet2", "NVIDIA (NVCaffe)": "NVIDIA/caffe",
    "Intel": "intel/caffe", "SphereFace": "wy1iu/sphereface",
    "center-loss (caffe-face)": "ydwen/caffe-face", "ShuffleNet": "farmingyard/ShuffleNet",
    "AM-Softmax": "happynear/caffe-windows (ms)", "caffe-mobilenet": "farmingyard/caffe-mobilenet",
    "SENet": "hujie-frank/SENet", "caffe_ocr (CRNN)": "senlinuc/caffe_ocr",
    "DepthwiseConvolution": "yonghenglh6/DepthwiseConvolution",
    "MobileNet-YOLO": "eric612/MobileNet-YOLO",
}

PORT = "port it as a Python layer (type: Python, python_param: {module, layer})"

# The fix an error gives for a fork's type, where a BVLC form exists (else: port it).
FIXES: dict[str, str] = {
    "MKLBatchNorm": f"use BatchNorm followed by Scale with bias_term: true, or {PORT}",
    "ReLU6": f"use Clip with clip_param {{min: 0, max: 6}}, or {PORT}",
    "DepthwiseConvolution": f"use Convolution with group equal to the input channels, or {PORT}",
    # registered by several Faster R-CNN forks; py-faster-rcnn has it as a Python layer
    "Proposal": "use py-faster-rcnn's Python layer: type: Python, python_param {module: "
                "rpn.proposal_layer, layer: ProposalLayer}",
}


def fix_for(type_name: str) -> str:
    """How to get a net with ``type_name`` (a type caffe-py lacks) to build."""
    return FIXES.get(type_name, f"replace it with BVLC layers, or {PORT}")


def forks_of(type_name: str) -> list[str]:
    """The forks that register ``type_name``, in FORKS order."""
    return [fork for fork, types in FORKS.items() if type_name in types]


def origin(type_name: str) -> str | None:
    """Where a type caffe-py lacks comes from: 'SSD's Caffe fork', 'the SSD and Intel Caffe
    forks', 'BVLC Caffe 1.0'; None for a name no table knows."""
    if type_name in BVLC_TYPES:
        return "BVLC Caffe 1.0"
    if type_name == "Proposal":
        return "several Faster R-CNN Caffe forks"
    forks = forks_of(type_name)
    if not forks:
        return None
    if len(forks) == 1:
        return f"{forks[0]}'s Caffe fork"
    return f"the {', '.join(forks[:-1])} and {forks[-1]} Caffe forks"

