"""Caffe's bytes, read and written by hand: the protobuf wire format, Datum records, BlobProto
(mean files, the blobs of weight files), the image file inside an encoded Datum, the raw-record
fast path, and image files as Caffe's OpenCV sees them. No threads, no torch (README.md)."""
from .blobproto import BlobProto, blob_from_array, read_blob_file, read_mean_file, write_blob_file
from .datum import (
    Datum,
    datum_from_array,
    datum_to_array,
    decode_datum,
    decode_record,
    encode_datum,
    format_key,
)

__all__ = [
    "BlobProto", "Datum", "blob_from_array", "datum_from_array", "datum_to_array",
    "decode_datum", "decode_record", "encode_datum", "format_key", "read_blob_file",
    "read_mean_file", "write_blob_file",
]
