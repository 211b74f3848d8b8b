"""nbhelpers.gpu.compile: eager until compiled, compiled only for calls like the example, failures fall back, and
the compile cache of one process makes the next one warm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
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
    """Let the compiler run on this CPU machine (it compiles only for CUDA otherwise), as on a small GPU."""
    monkeypatch.setattr(gc, "can_compile", lambda device: (True, ""))
    monkeypatch.setattr(gc, "fp16_tflops", lambda device: 57.4)


def recording_compile(monkeypatch, calls):
    """torch.compile replaced by a wrapper that counts compiled calls and runs the eager function."""

    def fake_compile(fn, **kwargs):
        def compiled(*args, **kw):
            calls.append(tuple(args[0].shape))
            return fn(*args, **kw)

        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)


def test_compiles_run_with_dynamos_recompile_limit_raised(possible, monkeypatch):
    """Dynamo keeps 8 compiled variants of a function by default and runs later ones eagerly; a decoder can have
    more (batch shapes, tuning passes), so the compiles run with the limit at RECOMPILE_LIMIT (set where they run:
    torch's config can be per thread)."""
    import torch._dynamo.config as dynamo_config

    limits = []
    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: limits.append(getattr(dynamo_config, name)) or fn)
    with dynamo_config.patch(**{name: 8}):  # where the config is shared by threads, as by default
        comp = gc.BackgroundCompiler("cpu", mode="on")
        net = Net().eval()
        comp.install("net", net, dynamic_batch=False)
        with torch.inference_mode():
            comp.request("net", net, torch.randn(2, 3, 8, 8))
        assert comp.wait(30).state == "ready"
    assert limits and min(limits) >= gc.RECOMPILE_LIMIT > 8


def test_calls_are_eager_until_ready_then_compiled_only_for_the_example_signature(possible, monkeypatch):
    calls = []
    recording_compile(monkeypatch, calls)
    net = Net().eval()
    comp = gc.BackgroundCompiler("cpu", mode="on")
    comp.install("net", net, dynamic_batch=False)
    with torch.inference_mode():
        example = torch.randn(2, 3, 8, 8)
        before = net(torch.randn(2, 3, 8, 8))  # nothing asked yet: eager
    assert before.shape == (2, 4, 8, 8) and calls == []
    comp.request("net", net, example)
    status = comp.wait(30)
    assert status.state == "ready" and status.parts == {"net 2x3x8x8": "compiled"}
    calls.clear()
    with torch.inference_mode():
        x = torch.randn(2, 3, 8, 8)
        y = net(x)
        net(torch.randn(1, 3, 8, 8))  # another batch size: eager, and no compile of its own
        net(x.contiguous(memory_format=torch.channels_last))  # other strides: eager
    assert calls == [(2, 3, 8, 8)]
    assert comp.calls() == {"net": {"eager": 3, "compiled": 1}}
    with torch.no_grad():
        net(x)  # an inference tensor outside inference mode: eager (compiled code was made inside it)
    assert calls == [(2, 3, 8, 8)] and not comp.busy
    comp.remove()
    assert "forward" not in net.__dict__
    with torch.inference_mode():
        torch.testing.assert_close(net(x), y)


def test_calls_while_another_thread_traces_go_to_the_eager_model(possible, monkeypatch):
    """Compiled code refuses to run while any thread is inside FX tracing (torch's flag is process-wide), as the
    compiler thread is while it compiles another model: such calls use the eager model and give its result."""
    import torch.fx._symbolic_trace as fx_trace

    calls = []
    recording_compile(monkeypatch, calls)
    net = Net().eval()
    comp = gc.BackgroundCompiler("cpu", mode="on")
    comp.install("net", net, dynamic_batch=False)
    x = torch.randn(2, 3, 8, 8)
    with torch.inference_mode():
        comp.request("net", net, x)
        assert comp.wait(30).state == "ready"
        calls.clear()  # the compiler's own first call
        expected = net.forward.eager(x)
        monkeypatch.setattr(fx_trace, "is_fx_symbolic_tracing", lambda: True)
        torch.testing.assert_close(net(x), expected)
        assert calls == [] and comp.calls()["net"] == {"eager": 1, "compiled": 0}
        monkeypatch.setattr(fx_trace, "is_fx_symbolic_tracing", lambda: False)

        def refusing(*args, **kwargs):  # the flag was set between the check and the call
            raise RuntimeError("Detected that you are using FX to symbolically trace a dynamo-optimized function.")

        monkeypatch.setitem(net.forward.compiled, False, refusing)
        torch.testing.assert_close(net(x), expected)
        assert comp.calls()["net"] == {"eager": 2, "compiled": 0}

        def broken(*args, **kwargs):
            raise RuntimeError("CUDA error: an illegal memory access")

        monkeypatch.setitem(net.forward.compiled, False, broken)
        with pytest.raises(RuntimeError, match="illegal memory access"):
            net(x)
    comp.remove()


def test_a_signature_that_repeats_is_compiled_without_being_asked(possible, monkeypatch):
    calls = []
    recording_compile(monkeypatch, calls)
    net = Net().eval()
    comp = gc.BackgroundCompiler("cpu", mode="on")
    comp.install("net", net, dynamic_batch=False)
    with torch.no_grad():
        x = torch.randn(3, 3, 8, 8)
        net(x)
        assert calls == [] and not comp.busy  # seen once: not yet
        net(x)  # seen twice: its compile is asked for, with copies of the call's tensors
        comp.wait(30)
        calls.clear()
        net(x)
    assert calls == [(3, 3, 8, 8)] and comp.status.parts == {"net 3x3x8x8": "compiled"}
    with torch.enable_grad():
        net(x)
        net(x)  # with autograd on: never compiled
    assert not comp.busy and len(comp.status.parts) == 1


@pytest.mark.parametrize("user_threads", [None, "2"])
def test_a_warm_cache_compiles_without_a_worker_pool_unless_the_user_set_one(possible, monkeypatch, tmp_path,
                                                                             user_threads):
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = None  # undecided, as in a new process (torch >= 2.6: per thread context)
    if user_threads is None:
        monkeypatch.delenv("TORCHINDUCTOR_COMPILE_THREADS", raising=False)
    else:
        monkeypatch.setenv("TORCHINDUCTOR_COMPILE_THREADS", user_threads)
    monkeypatch.setattr(gc, "_load_artifacts", lambda folder, key: set())  # an earlier session's cache files
    seen = []

    def fake_compile(fn, **kwargs):  # what inductor would read when it compiles (its config is per thread)
        seen.append(inductor_config.compile_threads)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    net = Net().eval()
    comp = gc.BackgroundCompiler("cpu", mode="on", cache_dir=tmp_path / "cache", facts={"net": "tiny"})
    with torch.inference_mode():
        comp.request("net", net, torch.randn(2, 3, 8, 8), dynamic_batch=False)
    status = comp.wait(30)
    assert status.state == "ready" and status.warm
    # the user's value: read from the environment now or when inductor first decides
    assert seen == [1] if user_threads is None else seen in ([None], [int(user_threads)])


def test_cached_only_compiles_just_the_parts_an_earlier_sessions_cache_holds(possible, monkeypatch, tmp_path):
    calls = []
    recording_compile(monkeypatch, calls)
    monkeypatch.setattr(gc, "_load_artifacts", lambda folder, key: set())
    facts = {"net": "tiny"}
    key, _ = gc.cache_key({**facts, "options": {}})
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / f"{key}-0.json").write_text(json.dumps({"parts": ["cached 2x3x8x8"]}))
    (folder / f"{'f' * 16}-0.json").write_text(json.dumps({"parts": ["other 2x3x8x8"]}))  # another runtime's
    comp = gc.BackgroundCompiler("cpu", mode="on", cache_dir=folder, facts=facts)
    assert comp.cached_parts() == {"cached 2x3x8x8"}
    nets = {name: Net().eval() for name in ("cached", "other", "asked")}
    with torch.inference_mode():
        x = torch.randn(2, 3, 8, 8)
        for name, net in nets.items():
            comp.request(name, net, x, dynamic_batch=False, cached_only=name != "asked")
        assert comp.wait(30).parts == {"cached 2x3x8x8": "compiled", "asked 2x3x8x8": "compiled"}
        for _ in range(3):  # never asked for: not installed, so never compiled unasked either
            nets["other"](x)
    assert "forward" not in nets["other"].__dict__ and not comp.busy and len(comp.status.parts) == 2


def test_one_compile_with_a_dynamic_batch_serves_every_batch_of_two_or_more(possible, monkeypatch):
    calls = []
    recording_compile(monkeypatch, calls)
    net = Net().eval()
    comp = gc.BackgroundCompiler("cpu", mode="on")
    with torch.inference_mode():
        comp.request("net", net, torch.zeros(4, 3, 8, 8))
        assert comp.wait(30).parts == {"net Bx3x8x8": "compiled"}
        calls.clear()
        for b in (2, 5, 4, 1):
            net(torch.randn(b, 3, 8, 8))
    assert calls == [(2, 3, 8, 8), (5, 3, 8, 8), (4, 3, 8, 8)]  # one row: eager (compiled code needs 2 or more)
    assert comp.calls() == {"net": {"eager": 1, "compiled": 3}}


def test_a_batch_shape_compiled_for_itself_goes_first_and_the_dynamic_code_serves_the_rest(possible, monkeypatch):
    calls = []

    def fake_compile(fn, dynamic=None, **kwargs):
        def compiled(x):
            calls.append(("static" if dynamic is False else "dynamic", x.shape[0]))
            return fn(x)

        return compiled

    monkeypatch.setattr(torch, "compile", fake_compile)
    net = Net().eval()
    comp = gc.BackgroundCompiler("cpu", mode="on")
    with torch.inference_mode():
        comp.request("net", net, torch.zeros(4, 3, 8, 8), dynamic_batch=False)
        comp.request("net", net, torch.zeros(3, 3, 8, 8), dynamic_batch=True)
        assert comp.wait(30).parts == {"net 4x3x8x8": "compiled", "net Bx3x8x8": "compiled"}
        calls.clear()
        for b in (4, 3, 6, 4):
            net(torch.randn(b, 3, 8, 8))
    assert calls == [("static", 4), ("dynamic", 3), ("dynamic", 6), ("static", 4)]


def test_auto_compiles_only_where_the_gpu_limits_the_job(monkeypatch):
    monkeypatch.setattr(gc, "can_compile", lambda device: (True, ""))
    monkeypatch.setattr(gc, "fp16_tflops", lambda device: 57.4)  # a T4-class GPU
    assert gc.BackgroundCompiler("cpu", mode="auto").enabled
    monkeypatch.setattr(gc, "fp16_tflops", lambda device: 750.0)  # an H200: the CPU side limits jobs
    comp = gc.BackgroundCompiler("cpu", mode="auto")
    assert not comp.enabled and "750 TFLOP/s" in comp.status.reason and "compile='on'" in comp.status.reason
    assert gc.BackgroundCompiler("cpu", mode="on").enabled


def test_a_failed_compile_warns_and_keeps_the_eager_model(possible, monkeypatch):
    def broken(fn, **kwargs):
        raise RuntimeError("inductor: no working C++ compiler (forced by the test)")

    monkeypatch.setattr(torch, "compile", broken)
    net = Net().eval()
    with torch.inference_mode():
        x = torch.randn(2, 3, 8, 8)
        expected = Net.forward(net, x)
    comp = gc.BackgroundCompiler("cpu", mode="on")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        comp.request("net", net, x)
        status = comp.wait(30)
    assert status.state == "failed" and status.parts == {"net Bx3x8x8": "failed"}
    assert "no working C++ compiler" in status.reason
    assert any(issubclass(w.category, FallbackWarning) and "stays eager" in str(w.message) for w in caught)
    with torch.inference_mode():
        torch.testing.assert_close(net(x), expected)


def test_off_and_impossible_leave_the_model_alone(monkeypatch):
    net = Net()
    comp = gc.BackgroundCompiler("cpu", mode="off")
    comp.request("net", net, torch.randn(1, 3, 4, 4))
    assert "forward" not in net.__dict__ and comp.wait(1).state == "off"
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
    gc.fp16_tflops = lambda device: 57.4
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.SiLU()).eval()
    with torch.inference_mode():
        x = torch.randn(2, 3, 8, 8)
    comp = gc.BackgroundCompiler("cpu", cache_dir=sys.argv[1], facts={"net": "tiny"})
    comp.request("net", net, x)
    status = comp.wait(300)
    with torch.inference_mode():
        y = net(x)
    files = sorted(__import__("pathlib").Path(sys.argv[1]).rglob("*.bin"))
    print(json.dumps({"state": status.state, "warm": status.warm, "compiled": net.forward.calls["compiled"],
                      "sum": float(y.sum()), "inodes": [p.stat().st_ino for p in files]}))
""")


@pytest.mark.slow
def test_each_finished_part_is_in_the_cache_before_the_queue_ends(possible, monkeypatch, tmp_path):
    """The cache file holds every part compiled so far, one file per process, replaced as parts are added: a
    command-line job that ends mid-queue (the compile thread is a daemon) keeps what it finished."""
    import threading

    gate, compiled = threading.Event(), []

    def fake_compile(fn, **kwargs):
        def run(*args, **kw):
            if compiled:  # the second part waits: the process could end here
                assert gate.wait(30)
            compiled.append(args[0].shape[0])
            return fn(*args, **kw)

        return run

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts",  # torch's artifacts accumulate over the process
                        lambda: (b"x" * 10 * len(compiled), None), raising=False)
    folder = tmp_path / "cache"
    comp = gc.BackgroundCompiler("cpu", mode="on", cache_dir=folder, facts={"net": "tiny"})
    with torch.inference_mode():
        comp.request("a", Net().eval(), torch.randn(2, 3, 8, 8), dynamic_batch=False)
        comp.request("b", Net().eval(), torch.randn(3, 3, 8, 8), dynamic_batch=False)

    def metas():
        return [json.loads(p.read_text()) for p in folder.glob("*.json")]

    for _ in range(300):  # the first part's file appears while the second still compiles
        if metas():
            break
        threading.Event().wait(0.1)
    assert [m["parts"] for m in metas()] == [["a 2x3x8x8"]] and comp.busy
    gate.set()
    assert comp.wait(30).state == "ready"
    (meta,) = metas()
    assert meta["parts"] == ["a 2x3x8x8", "b 3x3x8x8"] and meta["size"] == 20
    assert len(list(folder.glob("*.bin"))) == 1


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
    (meta_path,) = cache.glob("*.json")
    assert runs[1]["inodes"] == runs[0]["inodes"]  # only cached parts compiled: the file was not written again
    meta = json.loads(meta_path.read_text())
    assert meta["facts"]["models"]["net"] == "tiny" and meta["parts"] == ["net Bx3x8x8"] and meta["size"] > 0


@pytest.mark.slow
def test_a_lipsync_job_asks_for_the_signatures_it_then_calls(possible, monkeypatch, tiny_weights, shared_data,
                                                           make_media, tmp_path):
    """The pipeline's examples (made ahead, before the first frame) have the signatures of the job's real calls:
    every model's full batches run the compiled code, and the frames equal those of a run with compile off."""
    from nbhelpers import InferenceConfig, MuseTalkPipeline

    calls = []
    recording_compile(monkeypatch, calls)
    clip = make_media("face-8f.mp4", "-i", str(shared_data / "face-sing-576x768-25fps.mp4"), "-frames:v", "8",
                      "-an", "-c:v", "libx264", "-crf", "12", "-pix_fmt", "yuv420p")
    speech = make_media("speech-0.64s.wav", "-i", str(shared_data / "speech-en-short.wav"), "-t", "0.64")
    box = (190, 160, 360, 330)

    def job(pipe, name):
        got = {}
        pipe.lipsync(clip, speech, tmp_path / f"{name}.mp4", boxes=box,
                     frame_callback=lambda t, f: got.__setitem__(t, f.copy()))
        return got

    eager = MuseTalkPipeline.from_pretrained(tiny_weights, InferenceConfig(device="cpu", batch_size=4))
    eager._compiler = gc.BackgroundCompiler("cpu", mode="off")
    expected = job(eager, "eager")
    pipe = MuseTalkPipeline.from_pretrained(tiny_weights, InferenceConfig(device="cpu", batch_size=4))
    job(pipe, "first")  # asks for the compiles at its plan; its calls run eagerly until they are ready
    status = pipe.compiler.wait(120)
    assert status.state == "ready", status
    assert set(status.parts) == {"unet Bx8x32x32", "vae decoder 4x4x32x32",
                                 "vae encoder 8x3x256x256", "face parser Bx3x512x512"}
    before = pipe.compiler.calls()
    frames = job(pipe, "second")
    after = pipe.compiler.calls()
    # 16 output frames in batches of 4 from 8 source frames: every call of the second job matched compiled code
    for name in ("unet", "vae decoder", "vae encoder", "face parser"):
        assert after[name]["eager"] == before[name]["eager"], (name, before, after)
        assert after[name]["compiled"] > before[name]["compiled"], (name, before, after)
    assert frames.keys() == expected.keys() and len(expected) == 16
    for t in expected:
        np.testing.assert_array_equal(frames[t], expected[t])


def _full_weights():
    folder = os.environ.get("NBHELPERS_FULL_WEIGHTS")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (runs on the project's GPU machine)")
    if not folder:
        pytest.skip("set NBHELPERS_FULL_WEIGHTS to a folder of full-size random weights (bench/_common.py)")
    return folder


def _avatar_frames(weights, work, shared_data, make_media, compile_mode, fp16=True):
    """The frames of 1 s of speech over an 8-frame avatar of the shared video, on full-size weights."""
    from nbhelpers import InferenceConfig, MuseTalkPipeline, prepare_avatar

    clip = make_media("face-8f.mp4", "-i", str(shared_data / "face-sing-576x768-25fps.mp4"), "-frames:v", "8",
                      "-an", "-c:v", "libx264", "-crf", "12", "-pix_fmt", "yuv420p")
    speech = make_media("speech-1s.wav", "-i", str(shared_data / "speech-en-short.wav"), "-t", "1.0")
    config = InferenceConfig(device="cuda", fp16=fp16, batch_size=20, compile=compile_mode)
    pipe = MuseTalkPipeline.from_pretrained(weights, config)
    avatar = prepare_avatar(clip, work / f"avatar-{compile_mode}-{fp16}", pipe, config=config,
                            boxes=(190, 160, 360, 330))
    avatar.optimize()  # compile="on": wait until compiled; "off": returns at once
    frames = {}
    avatar.generate(speech, False, frame_callback=lambda t, f: frames.__setitem__(t, f.copy()))
    return frames, pipe


def _largest_difference(a: dict, b: dict) -> tuple[int, float]:
    """(largest difference of any pixel in grey levels, share of values more than 1 level apart)."""
    assert a.keys() == b.keys()
    diffs = [np.abs(a[t].astype(int) - b[t].astype(int)) for t in a]
    return max(int(d.max()) for d in diffs), float(np.mean([(d > 1).mean() for d in diffs]))


@pytest.mark.gpu
def test_compiled_frames_are_as_close_to_eager_as_fp16_is_to_fp32_on_full_size_weights(shared_data, make_media,
                                                                                        tmp_path):
    """Compiled fp16 code rounds differently from eager fp16 (fused kernels, other accumulation orders); random
    full-size weights magnify any rounding past a level. So the bound is fp16's own: compiled frames differ from eager
    fp16 frames no more than eager fp16 frames differ from eager fp32 ones, and at most 0.1 % of values by more than
    1 level."""
    weights = _full_weights()
    eager, _ = _avatar_frames(weights, tmp_path, shared_data, make_media, "off")
    full, _ = _avatar_frames(weights, tmp_path, shared_data, make_media, "off", fp16=False)
    compiled, pipe = _avatar_frames(weights, tmp_path, shared_data, make_media, "on")
    assert pipe.compiler.status.state == "ready", pipe.compiler.status
    counts = pipe.compiler.calls()
    assert counts["unet"]["compiled"] > 0 and counts["vae decoder"]["compiled"] > 0, counts
    assert eager.keys() == compiled.keys() and len(eager) == 25
    worst, share = _largest_difference(eager, compiled)
    fp16_worst, fp16_share = _largest_difference(eager, full)
    print(f"compiled vs eager fp16: {worst} levels, {share:.2e} over 1; eager fp16 vs fp32: {fp16_worst} levels, "
          f"{fp16_share:.2e} over 1")
    assert worst <= max(1, fp16_worst) and share <= 1e-3, (worst, share, fp16_worst, fp16_share)


@pytest.mark.gpu
def test_a_compile_that_fails_on_the_gpu_falls_back_to_eager(shared_data, make_media, tmp_path, monkeypatch):
    weights = _full_weights()
    eager, _ = _avatar_frames(weights, tmp_path, shared_data, make_media, "off")

    def broken(fn, **kwargs):
        raise RuntimeError("inductor backend failed to compile (forced by the test)")

    monkeypatch.setattr(torch, "compile", broken)
    with pytest.warns(FallbackWarning, match="forced by the test"):
        frames, pipe = _avatar_frames(weights, tmp_path, shared_data, make_media, "on")
    assert pipe.compiler.status.state == "failed"
    for t in eager:
        np.testing.assert_array_equal(frames[t], eager[t])


@pytest.mark.gpu
def test_the_face_models_are_compiled_for_the_offline_jobs_calls(tiny_weights):
    """compile_face_models asks for S3FD and DWPose with the signatures of the offline job's calls: once compiled, a
    32-frame call runs compiled code only, and DWPose's SimCC maps stay within fp16 rounding of the eager ones."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (runs on the project's GPU machine)")
    from nbhelpers.faces.dwpose_torch import DWPoseBackend
    from nbhelpers.offline import FACE_BATCH_GPU, compile_face_models, fit_face_batches

    frames = np.random.default_rng(0).integers(0, 256, (FACE_BATCH_GPU, 96, 128, 3), dtype=np.uint8)
    backend = DWPoseBackend(tiny_weights, "cuda")
    fit_face_batches(backend, frames.shape[1:3], "cuda")
    s3fd, pose = backend.face_detector, backend.pose
    inputs = pose._inputs(frames)[0]
    eager = pose.simcc(inputs)
    comp = gc.BackgroundCompiler("cuda", mode="on")
    compile_face_models(comp, backend, frames.shape[1:3])
    status = comp.wait(900)
    assert status.state == "ready" and set(status.parts) == {
        f"s3fd {s3fd.batch_size}x3x96x128", f"dwpose {2 * pose.batch_size}x3x384x288"}, status
    before = comp.calls()
    backend.face_detector.detect(torch.from_numpy(frames).cuda())  # as the job: the piece already on the GPU
    compiled = pose.simcc(inputs)
    after = comp.calls()
    assert after["s3fd"]["eager"] == before["s3fd"]["eager"]
    assert after["s3fd"]["compiled"] - before["s3fd"]["compiled"] == -(-FACE_BATCH_GPU // s3fd.batch_size)
    assert after["dwpose"] == {"eager": before["dwpose"]["eager"], "compiled": before["dwpose"]["compiled"] + 1}
    for a, b in zip(eager[:2], compiled[:2], strict=True):
        assert float((a - b).abs().max()) <= 0.05 * float(a.abs().max()) + 1e-3
