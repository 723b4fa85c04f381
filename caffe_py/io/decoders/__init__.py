"""Image files decoded for the reader and the feeds: the decode threads and their knobs, the
decode processes, one file's crop, and the CPU (libjpeg-turbo) and GPU (nvJPEG) JPEG decoders
of torchvision (README.md)."""
from .decode_processes import DecodeProcesses, InFlight, ProcessCrops
from .workers import DecodeOptions, DecodeWorkers

__all__ = ["DecodeOptions", "DecodeProcesses", "DecodeWorkers", "InFlight", "ProcessCrops"]
