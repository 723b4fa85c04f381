"""Solver spec loading: Caffe's fields and defaults, paths, and each cross-field rule."""
import textwrap

import pytest

from caffe_py.errors import SpecError
from caffe_py.spec.solver_spec import load_solver

NET = "name: tiny\nlayer: []\n"


def write(tmp_path, text, name="solver.yaml"):
    (tmp_path / "net.yaml").write_text(NET)
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def error_of(tmp_path, text):
    with pytest.raises(SpecError) as err:
        load_solver(write(tmp_path, text))
    return str(err.value)


def test_lenet_style_solver_loads_with_caffe_defaults(tmp_path):
    p = load_solver(write(tmp_path, """\
        net: net.yaml
        test_iter: 100
        test_interval: 500
        base_lr: 0.01
        momentum: 0.9
        weight_decay: 0.0005
        lr_policy: inv
        gamma: 1e-4
        power: 0.75
        max_iter: 10
        snapshot_prefix: out/lenet
        """))
    assert p.net == str(tmp_path / "net.yaml")
    assert p.gamma == 1e-4 and p.test_iter == [100]
    assert (p.type, p.iter_size, p.average_loss, p.momentum2, p.delta) == (
        "SGD", 1, 1, 0.999, 1e-8)
    assert p.test_initialization and p.snapshot_after_train and p.clip_gradients == -1
    assert p.random_seed == -1 and p.precision == "FLOAT32" and p.snapshot_format == "pt"
    assert p.snapshot_prefix == str(tmp_path / "out" / "lenet")
    (train, state), = [p.train_net_spec()]
    assert train.name == "tiny" and state.phase == "TRAIN"
    tests = p.test_net_specs()
    assert len(tests) == 1 and tests[0][1].phase == "TEST"


def test_train_and_test_states_merge_over_the_nets_own_state(tmp_path):
    """Solver::InitTrainNet / InitTestNets: the phase, then the net's state, then the
    solver's train_state / test_state; set fields win and stages add up."""
    p = load_solver(write(tmp_path, """\
        train_net_param: {name: a, state: {level: 2, stage: s}, layer: []}
        test_net_param: [{name: b, state: {phase: TRAIN}, layer: []}, {name: c, layer: []}]
        test_iter: [1, 1]
        train_state: {stage: t}
        test_state: [{level: 4}, {phase: TRAIN, stage: u}]
        base_lr: 0.1
        """))
    _, train = p.train_net_spec()
    assert (train.phase, train.level, train.stage) == ("TRAIN", 2, ["s", "t"])
    states = [state for _, state in p.test_net_specs()]
    assert [(st.phase, st.level, st.stage) for st in states] == [
        ("TRAIN", 4, []), ("TRAIN", 0, ["u"])]


def test_empty_prefix_is_the_solver_file_name_and_a_directory_gets_it_appended(tmp_path):
    p = load_solver(write(tmp_path, "net: net.yaml\nbase_lr: 0.1\n", name="my_solver.yaml"))
    assert p.snapshot_prefix == str(tmp_path / "my_solver")
    p = load_solver(write(tmp_path, "net: net.yaml\nbase_lr: 0.1\nsnapshot_prefix: snaps/\n",
                          name="s2.yaml"))
    assert p.snapshot_prefix == str(tmp_path / "snaps" / "s2")


def test_inline_net_param_and_explicit_test_nets(tmp_path):
    p = load_solver(write(tmp_path, """\
        train_net_param: {name: a, layer: []}
        test_net: [net.yaml, net.yaml]
        test_iter: [2, 3]
        base_lr: 0.1
        """))
    assert p.train_net_spec()[0].name == "a"
    assert [n.name for n, _ in p.test_net_specs()] == ["tiny", "tiny"]


@pytest.mark.parametrize("text, message", [
    ("net: net.yaml\nbase_lr: 0.1\ntype: AdaGrad\nmomentum: 0.9\n",
     "solver.yaml:4: momentum: momentum cannot be used with AdaGrad (got 0.9); "
     "remove momentum or set it to 0"),
    ("net: net.yaml\nbase_lr: 0.1\nlr_policy: step\ngamma: 0.1\n",
     "solver.yaml:3: lr_policy: lr_policy step needs stepsize; add 'stepsize: <value>'"),
    ("net: net.yaml\nbase_lr: 0.1\nlr_policy: inv\ngamma: 0.1\n",
     "solver.yaml:3: lr_policy: lr_policy inv needs power; add 'power: <value>'"),
    ("train_net: net.yaml\nbase_lr: 0.1\ntest_iter: 5\n",
     "solver.yaml:3: test_iter: test_iter is given but there is no test net; "
     "add test_net, or use 'net:' for both phases"),
    ("net: net.yaml\ntest_net: net.yaml\nbase_lr: 0.1\n",
     "solver.yaml:2: test_net: 1 test net(s) but 0 test_iter value(s); "
     "give one test_iter per test net"),
    ("net: net.yaml\nbase_lr: 0.1\nlr_polcy: fixed\n",
     "solver.yaml:3: lr_polcy: unknown key 'lr_polcy' in SolverParameter; "
     "did you mean 'lr_policy'?"),
    ("net: net.yaml\nbase_lr: 0.1\ntype: adam\n",
     "solver.yaml:3: type: 'adam' is not one of SGD, Nesterov, AdaGrad, RMSProp, AdaDelta, "
     "Adam; did you mean 'Adam'?"),
    ("net: net.yaml\nmax_iter: 3\n", "solver.yaml:1: base_lr is not set; add e.g. 'base_lr: 0.01'"),
    ("base_lr: 0.1\n", "solver.yaml:1: no net is given; add 'net: <file>' (or net_param, "
                       "train_net)"),
    ("net: net.yaml\ntrain_net: net.yaml\nbase_lr: 0.1\n",
     "solver.yaml:2: train_net: net and train_net are all set; a solver trains one net; "
     "keep one of them"),
    ("net: net.yaml\nbase_lr: 0.1\nlr_policy: multistep\ngamma: 0.1\nstepvalue: [5, 3]\n",
     "solver.yaml:5: stepvalue: stepvalue must increase, got [5, 3]; "
     "list the iterations in ascending order"),
    ("net: net.yaml\nbase_lr: 0.1\nlr_policy: poly\npower: 1\n",
     "solver.yaml:1: max_iter: lr_policy poly needs max_iter > 0; set max_iter"),
    ("net: net.yaml\nbase_lr: 0.1\ntest_interval: 10\n",
     "solver.yaml:3: test_interval: test_interval is set but test_iter is not; "
     "add test_iter (batches per test pass), or remove test_interval"),
    ("net: net.yaml\nbase_lr: 0.1\niter_size: 0\n",
     "solver.yaml:3: iter_size: 0 is below the minimum 1; use a value >= 1"),
    ("net: net.yaml\nbase_lr: 0.1\nprecision: fp16\n",
     "solver.yaml:3: precision: 'fp16' is not one of FLOAT32, BF16, FLOAT16; use one of "
     "FLOAT32, BF16, FLOAT16"),
    ("net: net.yaml\nbase_lr: 0.1\nhost_average_async: true\n",
     "solver.yaml:3: host_average_async: host_average_async needs host_average_period > 0 "
     "(the iterations an exchange may overlap); add e.g. 'host_average_period: 16', or remove "
     "host_average_async"),
    ("net: net.yaml\nbase_lr: 0.1\nmodel_average_period: -4\n",
     "solver.yaml:3: model_average_period: -4 is below the minimum 0; use a value >= 0"),
    ("net: net.yaml\nbase_lr: 0.1\nlr_policy: inv\ngamma: -0.5\npower: 1\nmax_iter: 3\n",
     "solver.yaml:3: lr_policy: lr_policy inv gives no finite learning rate at iteration 2 "
     "with these gamma, power and stepsize; check gamma (inv: 1 + gamma * iter must stay > 0; "
     "step, exp, multistep: gamma^iter must stay finite)"),
    ("net: net.yaml\nbase_lr: 0.1\nlr_policy: step\nstepsize: 1\ngamma: 1e30\nmax_iter: 10\n",
     "solver.yaml:3: lr_policy: lr_policy step gives no finite learning rate at iteration 9 "
     "with these gamma, power and stepsize; check gamma (inv: 1 + gamma * iter must stay > 0; "
     "step, exp, multistep: gamma^iter must stay finite)"),
    ("net: net.yaml\nbase_lr: 0.1\ntype: Adam\nmomentum: 1\n",
     "solver.yaml:4: momentum: Adam needs momentum < 1 (its bias correction divides by 1 - "
     "momentum^t), got 1; use e.g. momentum: 0.9"),
    ("net: net.yaml\nbase_lr: 0.1\ntype: Adam\nmomentum2: 1\n",
     "solver.yaml:4: momentum2: Adam needs momentum2 < 1 (its bias correction divides by 1 - "
     "momentum2^t), got 1; use e.g. momentum2: 0.999"),
    ("net: net.yaml\nbase_lr: .inf\n",
     "solver.yaml:2: base_lr: base_lr is inf, not a finite number; give a finite value"),
    ("net: net.yaml\nbase_lr: 0.1\nlr_policy: exp\ngamma: .inf\n",
     "solver.yaml:4: gamma: gamma is inf, not a finite number; give a finite value"),
    ("net: net.yaml\nbase_lr: .nan\n",
     "solver.yaml:2: base_lr: nan is not a number; use a number >= 0"),
    ("net: net.yaml\nbase_lr: 0.1\nmomentum: .NaN\n",
     "solver.yaml:3: momentum: nan is not a number; use a number >= 0 and <= 1"),
])
def test_errors_name_file_line_key_and_fix(tmp_path, text, message):
    got = error_of(tmp_path, text)
    assert got == f"{tmp_path / 'solver.yaml'}{message[len('solver.yaml'):]}"


def test_missing_net_file_names_the_solver_key(tmp_path):
    p = load_solver(write(tmp_path, "base_lr: 0.1\nnet: nowhere.yaml\n"))
    with pytest.raises(SpecError) as err:
        p.train_net_spec()
    assert str(err.value) == (f"{tmp_path / 'solver.yaml'}:2: net: net file not found: "
                              f"{tmp_path / 'nowhere.yaml'}; check the path (relative to the "
                              "solver file's directory)")


def test_inline_net_errors_point_inside_the_solver(tmp_path):
    got = error_of(tmp_path, "base_lr: 0.1\nnet_param:\n  name: x\n  layer:\n    - type: Nope\n")
    assert got.startswith(f"{tmp_path / 'solver.yaml'}:5: net_param.layer[0].type: "
                          "unknown layer type 'Nope'")


def test_the_consistency_fields_default_to_caffes_synchronous_training(tmp_path):
    p = load_solver(write(tmp_path, "net: net.yaml\nbase_lr: 0.1\n"))
    assert (p.model_average_period, p.host_average_period, p.host_average_async) == (0, 0, False)
    p = load_solver(write(tmp_path, "net: net.yaml\nbase_lr: 0.1\nmodel_average_period: 16\n"
                                    "host_average_period: 64\nhost_average_async: true\n"))
    assert (p.model_average_period, p.host_average_period, p.host_average_async) == (16, 64, True)


def test_written_fields_survive_dataclasses_replace(tmp_path):
    """is_set is Caffe's has_<field>(): a copy keeps what the spec wrote and where, and what
    replace (or code) changes counts as set too; a message built in code has nothing set."""
    import dataclasses

    from caffe_py.spec.schema import is_set, location
    from caffe_py.spec.solver_spec import SolverParameter

    p = load_solver(write(tmp_path, """\
        net: net.yaml
        base_lr: 0.01
        momentum: 0.9
        """))
    q = dataclasses.replace(p, max_iter=50)
    assert [is_set(q, k) for k in ("net", "base_lr", "momentum", "max_iter", "weight_decay")] \
        == [True, True, True, True, False]
    assert not is_set(p, "max_iter")  # the source is untouched
    assert location(q, "momentum").line == 3 and q.file == str(tmp_path / "solver.yaml")
    r = dataclasses.replace(q, weight_decay=0.0)  # the value as read: not set
    assert not is_set(r, "weight_decay") and is_set(r, "max_iter")
    p.gamma = 0.5
    assert is_set(p, "gamma")
    assert not is_set(SolverParameter(momentum=0.9), "momentum")
    assert not is_set(dataclasses.replace(SolverParameter(), momentum=0.9), "momentum")


CAFFE_SOLVER_FIELDS = (  # caffe.proto's SolverParameter (Caffe 1.0), every field
    "net net_param train_net test_net train_net_param test_net_param train_state test_state "
    "test_iter test_interval test_compute_loss test_initialization base_lr display "
    "average_loss max_iter iter_size lr_policy gamma power momentum weight_decay "
    "regularization_type stepsize stepvalue clip_gradients snapshot snapshot_prefix "
    "snapshot_diff snapshot_format solver_mode device_id random_seed type delta momentum2 "
    "rms_decay debug_info snapshot_after_train solver_type layer_wise_reduce weights").split()


def test_every_caffe_solver_field_is_known():
    from caffe_py.spec.schema import field_names
    from caffe_py.spec.solver_spec import SolverParameter

    assert set(CAFFE_SOLVER_FIELDS) <= set(field_names(SolverParameter))


def test_old_solver_type_enum_sets_type_and_inert_fields_say_so(tmp_path):
    p = load_solver(write(tmp_path, """\
        net: net.yaml
        base_lr: 0.1
        solver_type: NESTEROV
        snapshot_format: HDF5
        layer_wise_reduce: false
        snapshot_diff: true
        weights: [a.caffemodel, /abs/b.caffemodel]
        """))
    assert (p.type, p.snapshot_format) == ("Nesterov", "HDF5")
    assert p.weights == [str(tmp_path / "a.caffemodel"), "/abs/b.caffemodel"]
    assert p.layer_wise_reduce is False
    assert p.inert_notes() == [
        "snapshot_diff: no diffs are written into snapshots (nothing reads them back); it "
        "changes nothing here"]
    got = error_of(tmp_path, "net: net.yaml\nbase_lr: 0.1\ntype: Adam\nsolver_type: ADAM\n")
    assert got == (f"{tmp_path / 'solver.yaml'}:4: solver_type: solver_type (the old enum) and "
                   "type are both set; Caffe refuses to upgrade that too; keep type only")
