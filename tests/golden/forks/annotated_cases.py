"""The AnnotatedData cases of make_annotated_golden.py and test_annotated_golden.py: one
AnnotatedData layer (TEST phase: no random step) per case, over the PNG-encoded or the raw LMDB
of the tiny set in tests/golden/forks/ssd/annotated/."""
from __future__ import annotations

MEAN = [104.0, 117.0, 123.0]

CASES = [
    {"name": "warp", "encoded": True, "batch_size": 4,
     "transform_param": {"mean_value": MEAN, "scale": 0.5,
                         "resize_param": {"resize_mode": "WARP", "height": 24, "width": 32}}},
    {"name": "fit_pad", "encoded": True, "batch_size": 3,
     "transform_param": {"mean_value": [127.0],
                         "resize_param": {"resize_mode": "FIT_LARGE_SIZE_AND_PAD",
                                          "height": 30, "width": 30, "pad_value": [50.0]}}},
    {"name": "pad_mirrored", "encoded": True, "batch_size": 3,
     "transform_param": {"resize_param": {"resize_mode": "FIT_LARGE_SIZE_AND_PAD",
                                          "height": 28, "width": 36, "pad_mode": "MIRRORED"}}},
    {"name": "warp_crop_emit", "encoded": True, "batch_size": 6,
     "transform_param": {"crop_size": 20, "mean_value": MEAN,
                         "resize_param": {"resize_mode": "WARP", "height": 32, "width": 32},
                         "emit_constraint": {"emit_type": "CENTER"}}},
    {"name": "raw_crop", "encoded": False, "batch_size": 2,
     "transform_param": {"crop_size": 26, "mean_value": [127.0], "scale": 0.25}},
]


def _fields(block: dict, indent: str) -> list[str]:
    lines = []
    for key, value in block.items():
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, dict):
                lines += [f"{indent}{key} {{", *_fields(item, indent + "  "), f"{indent}}}"]
            else:
                lines.append(f"{indent}{key}: {item}")
    return lines


def layer_text(case: dict, source: str) -> str:
    """The case's net: the AnnotatedData layer alone, reading ``source``."""
    lines = ['name: "annotated"', "layer {", '  name: "data"', '  type: "AnnotatedData"',
             '  top: "data"', '  top: "label"', "  include { phase: TEST }",
             *_fields({"transform_param": case["transform_param"]}, "  "),
             "  data_param {", f'    source: "{source}"',
             f"    batch_size: {case['batch_size']}", "    backend: LMDB", "  }", "}"]
    return "\n".join(lines) + "\n"
