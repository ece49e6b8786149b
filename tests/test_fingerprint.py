"""The model fingerprint sees architecture: modules, hyper-parameters and the traced forward;
it is the same in every process, pinned for the built-in tasks, and refused by the coordinator
when one agent differs."""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coordinator.registry import Declaration, Registry, RunCancelled
from efpsn.params.config import RunConfig
from efpsn.tasks.catalog import make_task
from efpsn.tasks.fingerprint import describe_model, model_fingerprint

ROOT = Path(__file__).resolve().parents[1]

ARCH_MODELS = """
    import torch
    from torch import nn

    def _mlp(schema, activation):
        return nn.Sequential(nn.Flatten(), nn.Linear(schema.features, 5), activation,
                             nn.Linear(5, schema.classes))

    def make_tanh(schema):
        return _mlp(schema, nn.Tanh())

    def make_relu(schema):
        return _mlp(schema, nn.ReLU())

    def make_leaky(schema):
        return _mlp(schema, nn.LeakyReLU(0.1))

    def make_leakier(schema):
        return _mlp(schema, nn.LeakyReLU(0.2))

    class Functional(nn.Module):
        def __init__(self, schema, act):
            super().__init__()
            self.hidden = nn.Linear(schema.features, 5)
            self.out = nn.Linear(5, schema.classes)
            self.act = act

        def forward(self, x):
            return self.out(self.act(self.hidden(x.flatten(1))))

    def make_functional_tanh(schema):
        return Functional(schema, torch.tanh)

    def make_functional_relu(schema):
        return Functional(schema, torch.relu)

    class DataDependent(Functional):
        def forward(self, x):
            h = self.hidden(x.flatten(1))
            if h.sum() > 1e9:  # control flow on the data: torch.fx cannot trace this
                h = h * 0
            return self.out(self.act(h))

    def make_untraceable_tanh(schema):
        return DataDependent(schema, torch.tanh)

    def make_untraceable_relu(schema):
        return DataDependent(schema, torch.relu)

    def make_with_loss(schema):
        return _mlp(schema, nn.Tanh()), nn.CrossEntropyLoss(label_smoothing=0.1)
"""


@pytest.fixture()
def arch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "archmodels.py").write_text(textwrap.dedent(ARCH_MODELS))
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def printed(factory: str) -> bytes:
    return make_task(f"python:archmodels:{factory}", shape=(6,), classes=3).fingerprint()


def test_tanh_and_relu_with_equal_shapes_differ(arch: Path) -> None:
    tanh, relu = make_task("python:archmodels:make_tanh", shape=(6,), classes=3), \
        make_task("python:archmodels:make_relu", shape=(6,), classes=3)
    assert tanh.num_params == relu.num_params
    assert tanh.fingerprint() != relu.fingerprint()
    assert printed("make_tanh") == tanh.fingerprint()  # the same model twice: the same bytes
    assert printed("make_leaky") != printed("make_leakier")  # a hyper-parameter


def test_a_function_called_inside_forward_is_seen_through_tracing(arch: Path) -> None:
    assert printed("make_functional_tanh") != printed("make_functional_relu")
    text = describe_model(make_task("python:archmodels:make_functional_tanh", shape=(6,),
                                    classes=3).build_model())
    assert "call_function torch.tanh" in text


def test_an_untraceable_forward_falls_back_to_its_modules(arch: Path) -> None:
    """What the fingerprint cannot see: a function called in a forward that tracing cannot
    follow (the README and efpsn.tasks.fingerprint say so)."""
    model = make_task("python:archmodels:make_untraceable_tanh", shape=(6,), classes=3)
    assert "graph: not traceable" in describe_model(model.build_model())
    assert printed("make_untraceable_tanh") == printed("make_untraceable_relu")
    assert printed("make_untraceable_tanh") != printed("make_functional_tanh")


def test_the_loss_is_part_of_it(arch: Path) -> None:
    assert printed("make_with_loss") != printed("make_tanh")
    text = describe_model(nn.Linear(2, 2), loss=nn.CrossEntropyLoss(label_smoothing=0.1))
    assert "label_smoothing=0.1" in text


def test_the_text_holds_no_address() -> None:
    def local_loss(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(a, b)

    model = nn.Sequential(nn.Linear(2, 2))
    model.extra = object()  # not a plain value: left out, never printed with its address
    for loss in (lambda a, b: F.cross_entropy(a, b), local_loss,
                 functools.partial(F.cross_entropy, reduction="sum")):
        text = describe_model(model, loss=loss)
        assert "0x" not in text and " at " not in text, text
    assert "functools.partial(torch.nn.functional.cross_entropy, reduction='sum')" in \
        describe_model(model, loss=functools.partial(F.cross_entropy, reduction="sum"))
    assert model_fingerprint(model) == model_fingerprint(model, loss=F.cross_entropy)


FRESH = """
import sys
from efpsn.tasks.catalog import make_task
for spec, shape, classes in [("python:archmodels:make_tanh", (6,), 3), ("logreg", (12,), 2),
                             ("lenet", (1, 28, 28), 10), ("mlp:16,8", (6,), 3)]:
    print(make_task(spec, shape=shape, classes=classes).fingerprint().hex())
"""


@pytest.mark.process
def test_the_same_model_in_fresh_processes_gives_the_same_bytes(arch: Path) -> None:
    outputs = []
    for hash_seed in ("1", "2"):  # also across Python's string hashing
        env = {**os.environ, "PYTHONHASHSEED": hash_seed,
               "PYTHONPATH": os.pathsep.join([str(arch), str(ROOT)])}
        done = subprocess.run([sys.executable, "-c", FRESH], env=env, capture_output=True,
                              text=True, timeout=120, check=True)
        outputs.append(done.stdout.split())
    assert outputs[0] == outputs[1] and len(outputs[0]) == 4
    assert outputs[0][0] == printed("make_tanh").hex()


# Pinned for the torch of constraints.txt: a change here means every agent of a run must run
# the new code (a torch upgrade may change the traced text and so these values too).
PINNED = {
    ("logreg", (1, 28, 28), 10):
        "fa9be3baf7f8a9d41d7870bc3ce335bbe7d4bade4cbb0b259447def2f6f56455",
    ("logreg", (12,), 2): "1a7339a8904dc0c8d15ef791115506496652fe086c940b7d158ff1e66a71d77e",
    ("lenet", (1, 28, 28), 10):
        "cbbab109e1a9019914cf3d7a20808068c9869cfee1e4108444104e1bff5287e4",
    ("mlp:16,8", (6,), 3): "92de31d2856276ed0dd519086fc26acea8c3539ade34f46a24df2a6fe290b335",
}


@pytest.mark.parametrize("spec, shape, classes", list(PINNED))
def test_the_built_in_tasks_fingerprints_are_pinned(spec: str, shape: tuple[int, ...],
                                                    classes: int) -> None:
    assert make_task(spec, shape=shape, classes=classes).fingerprint().hex() == \
        PINNED[(spec, shape, classes)]


LOGREG_12_2 = """\
parameter linear.weight (2, 12) torch.float64
parameter linear.bias (2,) torch.float64
module . efpsn.tasks.models.LogisticRegression() []
module linear torch.nn.modules.linear.Linear(in_features=12, out_features=2, bias=True) \
[in_features=12, out_features=2]
graph: %images = placeholder images () {}
graph: %getattr_1 = call_function builtins.getattr (%images, 'shape') {}
graph: %getitem = call_function _operator.getitem (%getattr_1, 0) {}
graph: %reshape = call_method reshape (%images, %getitem, -1) {}
graph: %linear = call_module linear (%reshape) {}
graph: %output = output output (%linear) {}
loss torch.nn.functional.cross_entropy
"""


def test_the_pinned_logreg_value_is_the_hash_of_this_text() -> None:
    task = make_task("logreg", shape=(12,), classes=2)
    assert describe_model(task.build_model()) == LOGREG_12_2
    assert hashlib.sha256(LOGREG_12_2.encode()).hexdigest() == PINNED[("logreg", (12,), 2)]


def test_the_coordinator_names_the_agent_with_the_other_activation(arch: Path) -> None:
    config = RunConfig(data="local", input_shape="6", classes=3, task="python:archmodels:x",
                       m=3, N=3, key_bits=2048, agents=3)
    registry = Registry(config, run_id="r")
    for k, factory in ((1, "make_relu"), (2, "make_relu")):
        registry.register(f"agent{k}", f"h:{k}", Declaration(input_shape="6", classes=3,
                                                         model_fingerprint=printed(factory)))
    with pytest.raises(RunCancelled, match="model_fingerprint of agent3"):
        registry.register("agent3", "h:3", Declaration(
            input_shape="6", classes=3, model_fingerprint=printed("make_tanh")))
