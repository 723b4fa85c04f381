"""`cpy extract_features` (Caffe's tool under its name) against the genuine Caffe's output on
the same records and weights (fixtures/extract_features, made by its make_fixture.py)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner
from support import error_line

from caffe_py.cli import cli
from caffe_py.io.db.lmdb_store import LmdbWriter, open_db
from caffe_py.io.formats.datum import decode_datum

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "extract_features"


def test_extract_features_writes_what_caffes_tool_writes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    caffe = json.loads((FIXTURE / "caffe.json").read_text())
    with LmdbWriter(tmp_path / "records_lmdb") as writer:
        for key, value in caffe["records"]:
            writer.put(key.encode(), bytes.fromhex(value))
    (tmp_path / "w.caffemodel").write_bytes(bytes.fromhex(caffe["weights"]))
    (tmp_path / "net.prototxt").write_text((FIXTURE / "net.prototxt").read_text())
    result = CliRunner().invoke(cli, ["extract_features", "w.caffemodel", "net.prototxt",
                                      "ip,data", "ip_lmdb,data_lmdb", "3", "lmdb", "CPU"])
    assert result.exit_code == 0, result.output
    # Caffe's lines (its own log had: Using CPU, Extracting Features, then these three)
    assert result.stderr.splitlines() == [
        "Using CPU", "Note: net.prototxt is a Caffe prototxt, read in memory as its YAML spec "
        "(cpy import-prototxt net.prototxt OUT.yaml writes it)", "Opening dataset ip_lmdb",
        "Opening dataset data_lmdb",
        "Extracting Features", "Extracted features of 6 query images for feature blob ip",
        "Extracted features of 6 query images for feature blob data",
        "Successfully extracted the features!"]
    for blob in ("ip", "data"):
        with open_db(tmp_path / f"{blob}_lmdb") as reader:
            records = list(reader)
        theirs = caffe["features"][blob]
        assert [k.decode() for k, _ in records] == [row["key"] for row in theirs]
        for (_, value), row in zip(records, theirs, strict=True):
            datum = decode_datum(value)
            assert [datum.channels, datum.height, datum.width] == row["shape"]
            np.testing.assert_allclose(datum.float_data, row["float_data"], rtol=1e-6,
                                       atol=1e-7)
    # the ip blob is read after the in-place ReLU, as Caffe's blob holds it
    assert min(v for row in caffe["features"]["ip"] for v in row["float_data"]) == 0.0


def test_extract_features_errors_are_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    caffe = json.loads((FIXTURE / "caffe.json").read_text())
    with LmdbWriter(tmp_path / "records_lmdb") as writer:
        for key, value in caffe["records"]:
            writer.put(key.encode(), bytes.fromhex(value))
    (tmp_path / "w.caffemodel").write_bytes(bytes.fromhex(caffe["weights"]))
    (tmp_path / "net.prototxt").write_text((FIXTURE / "net.prototxt").read_text())
    base = ["extract_features", "w.caffemodel", "net.prototxt"]
    cases = {
        ("fc7", "f_lmdb", "1", "lmdb"): "Error: Unknown feature blob name fc7 in the network "
                                        "net.prototxt; its blobs: data, label, ip",
        ("ip,data", "f_lmdb", "1", "lmdb"): "Error: 2 blob name(s) and 1 database(s): the "
                                            "number of blob names and dataset names must be "
                                            "equal; give one database per blob",
        ("ip", "f_lmdb", "x", "lmdb"): "Error: extract_features: num_mini_batches 'x' is not a "
                                       "number",
        ("ip", "f_lmdb", "-1", "lmdb"): "Error: num_mini_batches is -1; give a number >= 1",
        ("ip,data", "f_lmdb,./f_lmdb", "1", "lmdb"): "Error: database ./f_lmdb is named for "
                                                     "blobs ip and data; give each blob a "
                                                     "database of its own",
        ("ip", "f_lmdb"): "Error: extract_features: expected 6 to 8 arguments, got 4; usage: "
                          "cpy extract_features pretrained_net_param "
                          "feature_extraction_proto_file extract_feature_blob_name1[,name2,...] "
                          "save_feature_dataset_name1[,name2,...] num_mini_batches db_type "
                          "[CPU/GPU] [DEVICE_ID=0]",
    }
    for args, message in cases.items():
        result = CliRunner().invoke(cli, [*base, *args])
        assert (result.exit_code, error_line(result.stderr)) == (1, message)
    assert not (tmp_path / "f_lmdb").exists()
