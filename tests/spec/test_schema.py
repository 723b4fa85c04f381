"""The typed message schema: conversion, one value for a list, choices, bounds, paths."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from caffe_py.errors import SpecError
from caffe_py.spec.schema import Check, Source, field, is_set, location, parse_message, to_dict
from caffe_py.spec.yamlio import loads


@dataclass
class Inner:
    """A nested message."""

    size: int = field(3, "a size", min=1, max=9)


@dataclass
class Message:
    """A message with one field of each kind."""

    count: int = field(0, "an integer")
    rate: float = field(0.5, "a number")
    flag: bool = field(False, "a switch")
    mode: str = field("MAX", "an enum", choices=("MAX", "AVE", "STOCHASTIC"))
    dims: list[int] = field([], "repeated")
    inner: Inner = field(Inner(), "nested")
    inners: list[Inner] = field([], "repeated nested")
    source: str = field("", "a path", path=True)
    maybe: int | None = field(None, "optional")

    def check(self, v: Check) -> None:
        if self.flag and self.count == 0:
            v.fail("flag", "flag needs a count", "set count")


def parse(text: str, base: Path = Path("/specs")) -> Message:
    return parse_message(Message, loads(text, "m.yaml"), Source("m.yaml", base), "msg")


def error_of(text: str) -> str:
    with pytest.raises(SpecError) as err:
        parse(text)
    return str(err.value)


def test_defaults_and_values():
    m = parse("count: 2\nrate: 1e-4\nmode: AVE\ndims: [1, 2]\ninner: {size: 4}\n")
    assert (m.count, m.rate, m.mode, m.dims, m.inner.size) == (2, 1e-4, "AVE", [1, 2], 4)
    assert parse("{}").inner == Inner() and parse("{}").maybe is None
    assert to_dict(parse("count: 1"))["inner"] == {"size": 3}


def test_one_value_where_a_list_is_declared():
    m = parse("dims: 7\ninners: {size: 2}\n")
    assert m.dims == [7] and m.inners == [Inner(2)]


def test_integral_floats_are_integers_but_fractions_are_not():
    assert parse("count: 3.0").count == 3
    assert error_of("count: 2.5") == "m.yaml:1: msg.count: expected an integer, got 2.5"
    assert error_of("count: true") == "m.yaml:1: msg.count: expected an integer, got True"


def test_type_errors_name_the_key_path_and_line():
    assert error_of("rate: fast") == "m.yaml:1: msg.rate: expected a number, got 'fast'"
    assert error_of("flag: 1") == "m.yaml:1: msg.flag: expected true or false, got 1"
    assert error_of("count: 1\ninners:\n  - {size: 2}\n  - {size: x}\n") == \
        "m.yaml:4: msg.inners[1].size: expected an integer, got 'x'"
    assert error_of("inner: 5") == "m.yaml:1: msg.inner: expected a mapping for Inner, got int 5"


def test_unknown_keys_suggest_the_nearest():
    assert error_of("count: 1\ncuont: 2\n") == \
        "m.yaml:2: msg.cuont: unknown key 'cuont' in Message; did you mean 'count'?"
    assert error_of("zzz: 1") == ("m.yaml:1: msg.zzz: unknown key 'zzz' in Message; valid keys: "
                                  "count, dims, flag, inner, inners, maybe, mode, rate, source")


def test_enums_suggest_the_nearest_choice():
    assert error_of("mode: AVG") == ("m.yaml:1: msg.mode: 'AVG' is not one of MAX, AVE, "
                                     "STOCHASTIC; did you mean 'AVE'?")
    assert error_of("mode: max") == ("m.yaml:1: msg.mode: 'max' is not one of MAX, AVE, "
                                     "STOCHASTIC; did you mean 'MAX'?")


def test_bounds():
    assert error_of("inner: {size: 0}") == \
        "m.yaml:1: msg.inner.size: 0 is below the minimum 1; use a value >= 1"
    assert error_of("inner: {size: 10}") == \
        "m.yaml:1: msg.inner.size: 10 is above the maximum 9; use a value <= 9"


def test_check_hook_points_at_the_key():
    assert error_of("count: 0\nflag: true\n") == "m.yaml:2: msg.flag: flag needs a count; set count"


def test_paths_resolve_against_the_files_directory(tmp_path):
    assert parse("source: ../data/db", base=Path("/specs/configs")).source == \
        "/specs/data/db"
    assert parse("source: /abs/db").source == "/abs/db"
    spec_dir = tmp_path / "configs"
    spec_dir.mkdir()
    (spec_dir / "m.yaml").write_text("source: db\n")
    m = parse_message(Message, loads("source: db\n"), Source.of(spec_dir / "m.yaml"))
    assert Path(m.source) == spec_dir.resolve() / "db"


def test_is_set_and_key_line():
    m = parse("rate: 0.5\n\ncount: 0\n")
    assert is_set(m, "rate") and is_set(m, "count") and not is_set(m, "mode")
    assert location(m, "count").line == 3 and location(m, "mode").line == 1


@dataclass
class Numbered:
    """Caffe enums with caffe.proto's numbers, and one name caffe-py adds."""

    op: str = field("SUM", "an enum", choices={"SUM": 1, "ASUM": 2, "MEAN": 4})
    engine: str = field("DEFAULT", "an enum", choices={"DEFAULT": 0, "CUDNN": 2, "TORCH": None})


def numbered(text: str) -> Numbered:
    return parse_message(Numbered, loads(text, "n.yaml"), Source("n.yaml"), "msg")


def test_an_enum_written_as_its_number_reads_as_its_name():
    m = numbered("op: 4\nengine: 2\n")
    assert (m.op, m.engine) == ("MEAN", "CUDNN")
    assert numbered("op: ASUM\nengine: TORCH\n").op == "ASUM"
    with pytest.raises(SpecError) as err:
        numbered("op: 3\n")
    assert str(err.value) == ("n.yaml:1: msg.op: 3 is not a value of this enum; use one of "
                              "SUM (1), ASUM (2), MEAN (4)")


def test_a_plain_list_of_choices_takes_no_numbers():
    assert "'1' is not one of MAX, AVE, STOCHASTIC" in error_of("mode: 1\n")


def test_every_caffe_enum_takes_caffe_proto_numbers():
    from caffe_py.spec.net_spec import parse_net

    text = """
layer:
  - {name: x, type: Input, top: x, input_param: {shape: {dim: [2, 3, 4, 4]}}, phase: 1}
  - {name: e, type: Eltwise, bottom: [x, x], top: e, eltwise_param: {operation: 0}}
  - {name: p, type: Pooling, bottom: e, top: p,
     pooling_param: {pool: 1, kernel_size: 2, round_mode: 1, engine: 2}}
  - {name: n, type: LRN, bottom: p, top: n, lrn_param: {norm_region: 1}}
  - {name: r, type: Reduction, bottom: n, top: r, reduction_param: {operation: 3}}
  - {name: c, type: Convolution, bottom: x, top: c, param: {share_mode: 1},
     convolution_param: {num_output: 1, kernel_size: 1,
                         weight_filler: {type: xavier, variance_norm: 2}}}
  - {name: l, type: SoftmaxWithLoss, bottom: [c, c], top: l, loss_param: {normalization: 3},
     include: {phase: 0}}
"""
    net = parse_net(loads(text, "net.yaml"), Source("net.yaml"))
    x, e, p, n, r, c, loss = net.layer
    assert x.phase == "TEST" and loss.include[0].phase == "TRAIN"
    assert e.params["eltwise_param"].operation == "PROD"
    pool = p.params["pooling_param"]
    assert (pool.pool, pool.round_mode, pool.engine) == ("AVE", "FLOOR", "CUDNN")
    assert n.params["lrn_param"].norm_region == "WITHIN_CHANNEL"
    assert r.params["reduction_param"].operation == "SUMSQ"
    assert c.param[0].share_mode == "PERMISSIVE"
    assert c.params["convolution_param"].weight_filler.variance_norm == "AVERAGE"
    assert loss.params["loss_param"].normalization == "NONE"
