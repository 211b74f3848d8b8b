"""nbhelpers.gpu.compile: eager until compiled, compiled only for calls like the example, failures fall back, and
the compile cache of one process makes the next one warm."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import warnings

import pytest

torch = pytest.importorskip("torch")

from nbhelpers.errors import FallbackWarning, InputError  # noqa: E402
from nbhelpers.gpu import compile as gc  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x, scale: float = 1.0):
        return torch.nn.functional.silu(self.conv(x)) * scale


@pytest.fixture
def possible(monkeypatch):
    """Let the compiler run on this CPU machine (it compiles only for CUDA otherwise)."""
    monkeypatch.setattr(gc, "can_compile", lambda device: (True, ""))


def recording_compile(monkeypatch, calls):
    """torch.compile replaced by a wrapper that counts compiled calls and runs the eager function."""

    def fake_compile(fn, **kwargs):
        def compiled(*args, **kw):
            calls.append(tuple(args[0].shape))
            return fn(*args, **kw)

        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)


def test_calls_are_eager_until_ready_then_compiled_only_for_the_example_signature(possible, monkeypatch):
    calls = []
    recording_compile(monkeypatch, calls)
    net = Net().eval()
    example = torch.randn(2, 3, 8, 8)
    comp = gc.BackgroundCompiler("cpu", mode="auto")
    comp.add("net", net, example)
    with torch.inference_mode():
        before = net(torch.randn(2, 3, 8, 8))  # not started yet: eager
    assert before.shape == (2, 4, 8, 8) and calls == []
    status = comp.start().wait(30)
    assert status.state == "ready" and status.parts == {"net": "compiled"}
    calls.clear()
    with torch.inference_mode():
        x = torch.randn(2, 3, 8, 8)
        y = net(x)
        net(torch.randn(1, 3, 8, 8))  # another batch size: eager, no compile of its own
        net(x.contiguous(memory_format=torch.channels_last))  # other strides: eager
    assert calls == [(2, 3, 8, 8)]
    assert net.forward.calls == {"eager": 3, "compiled": 1}
    with torch.no_grad():
        net(x)  # outside inference mode: eager (the compiled code was made under inference mode)
    assert calls == [(2, 3, 8, 8)]
    comp.remove()
    assert "forward" not in net.__dict__
    with torch.inference_mode():
        torch.testing.assert_close(net(x), y)


def test_a_failed_compile_warns_and_keeps_the_eager_model(possible, monkeypatch):
    def broken(fn, **kwargs):
        raise RuntimeError("inductor: no working C++ compiler (forced by the test)")

    monkeypatch.setattr(torch, "compile", broken)
    net = Net().eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.inference_mode():
        expected = Net.forward(net, x)
    comp = gc.BackgroundCompiler("cpu", mode="on")
    comp.add("net", net, x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status = comp.start().wait(30)
    assert status.state == "failed" and status.parts == {"net": "failed"}
    assert "no working C++ compiler" in status.reason
    assert any(issubclass(w.category, FallbackWarning) and "stay eager" in str(w.message) for w in caught)
    with torch.inference_mode():
        torch.testing.assert_close(net(x), expected)


def test_off_and_impossible_leave_the_model_alone(monkeypatch):
    net = Net()
    comp = gc.BackgroundCompiler("cpu", mode="off")
    comp.add("net", net, torch.randn(1, 3, 4, 4))
    assert "forward" not in net.__dict__ and comp.start().wait(1).state == "off"
    with pytest.warns(FallbackWarning, match="only on a CUDA GPU"):
        gc.BackgroundCompiler("cpu", mode="on")
    with pytest.raises(InputError, match="compile must be one of"):
        gc.BackgroundCompiler("cpu", mode="yes")


def test_the_cache_key_changes_with_the_models_and_the_runtime(monkeypatch):
    key_a, facts = gc.cache_key({"unet": {"block_out_channels": [320]}, "batch": 20})
    key_b, _ = gc.cache_key({"unet": {"block_out_channels": [320]}, "batch": 8})
    assert key_a != key_b and facts["runtime"]["torch"] == torch.__version__
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    key_c, _ = gc.cache_key({"unet": {"block_out_channels": [320]}, "batch": 20})
    assert key_c != key_a


SCRIPT = textwrap.dedent("""
    import json, sys, torch
    from nbhelpers.gpu import compile as gc
    gc.can_compile = lambda device: (True, "")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.SiLU()).eval()
    x = torch.randn(2, 3, 8, 8)
    comp = gc.BackgroundCompiler("cpu", cache_dir=sys.argv[1], facts={"net": "tiny"})
    comp.add("net", net, x)
    status = comp.start().wait(300)
    with torch.inference_mode():
        y = net(x)
    print(json.dumps({"state": status.state, "warm": status.warm, "compiled": net.forward.calls["compiled"],
                      "sum": float(y.sum()), "file": str(status.cache_file)}))
""")


@pytest.mark.slow
def test_a_second_process_loads_the_first_ones_compile_cache(tmp_path):
    if not hasattr(torch.compiler, "save_cache_artifacts"):
        pytest.skip(f"torch {torch.__version__} has no torch.compiler.save_cache_artifacts (2.7 and later)")
    cache = tmp_path / "compile-cache"
    env_dir = tmp_path / "inductor"  # each process gets its own, empty inductor folder: only our file carries over
    runs = []
    for i in range(2):
        env = {**__import__("os").environ, "TORCHINDUCTOR_CACHE_DIR": str(env_dir / str(i))}
        out = subprocess.run([sys.executable, "-c", SCRIPT, str(cache)], capture_output=True, text=True, env=env,
                             timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    first, second = runs
    assert first["state"] == second["state"] == "ready"
    assert (first["warm"], second["warm"]) == (False, True)
    assert first["compiled"] == second["compiled"] == 1
    assert first["sum"] == pytest.approx(second["sum"], rel=1e-6)
    meta = json.loads((cache / f"{first['file'].rsplit('/', 1)[1][:-4]}.json").read_text())
    assert meta["facts"]["models"]["net"] == "tiny" and meta["size"] > 0
