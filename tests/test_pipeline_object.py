"""The pipeline object: models load once and every job reuses them (counted with strace at the system-call level),
its settings rules, and how it shows itself."""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent('''
    import sys, pathlib
    import nbhelpers as nbh
    wd, video, audio, work, mode = sys.argv[1:6]
    work = pathlib.Path(work)
    pipe = nbh.MuseTalkPipeline.from_pretrained(wd, nbh.InferenceConfig(device="cpu", landmark_backend="dlib"))
    open(work / "MARK", "w").close()  # the weight files are counted from here on
    if mode == "reference":  # load every component once, run nothing
        pipe.unet, pipe.vae, pipe.whisper, pipe.feature_extractor, pipe.pe, pipe.face_parser, pipe.landmarks()
    else:
        pipe.preview(video)
        pipe.lipsync(video, audio, work / "a.mp4")
        pipe.lipsync(video, audio, work / "b.mp4", config=nbh.InferenceConfig(bbox_shift=4, batch_size=3))
        avatar = nbh.prepare_avatar(video, work / "avatar", pipe)
        clip = avatar.generate(audio, work / "c.mp4")
        assert clip.n_frames > 0 and (work / "c.mp4").is_file()
    print("LOADED", sorted(pipe.loaded))
''')


def _opens(log: str, roots: list[str]) -> collections.Counter:
    """Files under ``roots`` opened (openat, not directories) after the MARK file was created."""
    counts: collections.Counter = collections.Counter()
    marked = False
    for line in log.splitlines():
        m = re.search(r'openat\(AT_FDCWD, "([^"]+)", ([A-Z_|]+)', line)
        if not m or "= -1" in line:
            continue
        path, flags = m.group(1), m.group(2)
        if path.endswith("/MARK"):
            marked = True
            continue
        if marked and "O_DIRECTORY" not in flags and any(path.startswith(r) for r in roots):
            counts[os.path.relpath(path, roots[0]) if path.startswith(roots[0]) else os.path.basename(path)] += 1
    return counts


def _traced(tmp_path, name, args):
    work = tmp_path / name
    work.mkdir()
    log = work / "strace.log"
    env = dict(os.environ, NBHELPERS_PROGRESS="0", PYTHONWARNINGS="ignore")
    proc = subprocess.run(["strace", "-f", "-qq", "-e", "trace=openat", "-o", str(log), sys.executable, "-c", SCRIPT,
                           *map(str, args[:3]), str(work), name], capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return log.read_text(), proc.stdout


def test_every_job_on_one_pipeline_reads_each_weight_file_once(tiny_weights, face_clip, speech_clip, tmp_path):
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed (apt-get install strace): it counts the files the jobs open")
    pytest.importorskip("dlib")
    from nbhelpers.faces.dlib_backend import predictor_path

    video, audio = face_clip(8), speech_clip(0.4, 1)
    roots = [str(tiny_weights) + "/", str(predictor_path().parent) + "/"]
    ref_log, ref_out = _traced(tmp_path, "reference", [tiny_weights, video, audio])
    jobs_log, jobs_out = _traced(tmp_path, "jobs", [tiny_weights, video, audio])
    once, jobs = _opens(ref_log, roots), _opens(jobs_log, roots)
    loaded = ["face_parser", "feature_extractor", "landmarks:dlib", "pe", "unet", "vae", "whisper"]
    assert f"LOADED {loaded}" in ref_out and f"LOADED {loaded}" in jobs_out
    # every model file (and the dlib predictor) was read by the reference load...
    for name in ("musetalkV15/unet.pth", "sd-vae/diffusion_pytorch_model.safetensors", "whisper/model.safetensors",
                 "face-parse-bisent/79999_iter.pth"):
        assert once[name] >= 1, f"{name} not read by the reference load: {dict(once)}"
    assert any(k.endswith(".dat") for k in once), dict(once)
    # ...and a preview, two jobs, an avatar and its clip read each exactly as often as loading it once does
    assert jobs == once, f"jobs {dict(jobs)} vs one load {dict(once)}"


def test_job_settings_keep_the_pipeline_device_precision_and_version(tiny_weights):
    import nbhelpers as nbh
    from nbhelpers.errors import InputError

    pipe = nbh.MuseTalkPipeline.from_pretrained(tiny_weights, nbh.InferenceConfig(device="cpu"))
    assert pipe.loaded == [] and pipe.config.device == "cpu" and pipe.config.fp16 is False
    cfg = pipe.job_config(nbh.InferenceConfig(extra_margin=20))
    assert (cfg.device, cfg.fp16, cfg.version, cfg.extra_margin) == ("cpu", False, "v15", 20)
    with pytest.raises(InputError, match="version='v1'"):
        pipe.job_config(nbh.InferenceConfig(version="v1"))
    assert pipe.job_config(None, boxes=(1, 2, 3, 4)).landmark_backend == "boxes"
    text = repr(pipe)
    assert "v15 on cpu, fp32" in text and "nothing loaded yet" in text
    pipe.vae  # noqa: B018 - loads it
    assert pipe.loaded == ["vae"] and "<td>vae</td><td>loaded</td>" in pipe._repr_html_()
    pipe.release()
    assert pipe.loaded == []


def test_loading_plans_device_and_precision_and_each_job_its_batch(tiny_weights):
    import warnings

    import nbhelpers as nbh
    from nbhelpers.gpu import PlanWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pipe = nbh.MuseTalkPipeline.from_pretrained(tiny_weights, nbh.InferenceConfig(device="cpu", batch_size=8))
    notes = [str(w.message) for w in caught if issubclass(w.category, PlanWarning)]
    # No note at load: the plan there knows neither the frame size nor the length (it assumed 1920x1080), so each
    # job warns once, from its own plan; the batch is planned per job too, from the job's frames.
    assert notes == [] and pipe.config.device == "cpu" and pipe.config.fp16 is False
    assert pipe.config.batch_size == 8 and "batch_size" not in pipe.config.reasons
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = pipe.plan("lipsync", pipe.job_config(), 6, (768, 576), source_frames=6, landmark_backend="dlib")
    notes = [str(w.message) for w in caught if issubclass(w.category, PlanWarning)]
    assert cfg.batch_size == 6 and len(notes) == 2
    assert "face tracking by dlib" in notes[0] and "6 frames from 6 source frames" in notes[0]
    assert notes[1].startswith("batch_size 8 (user override, 6 for this 6-frame job) is more than the plan's 4")


def test_a_missing_weights_folder_is_named_as_such(tmp_path):
    import nbhelpers as nbh
    from nbhelpers.errors import WeightsError

    with pytest.raises(WeightsError, match="does not exist") as info:
        nbh.MuseTalkPipeline.from_pretrained(tmp_path / "nowhere", nbh.InferenceConfig(device="cpu"))
    assert f"--weights {tmp_path / 'nowhere'}" in str(info.value) and "demo --tiny" in str(info.value)


def test_an_output_under_a_file_is_refused_before_any_work(tmp_path):
    from nbhelpers.checks import output_path_for
    from nbhelpers.errors import InputError

    blocker = tmp_path / "afile"
    blocker.write_text("x")
    with pytest.raises(InputError, match="is a file, not a folder"):
        output_path_for(blocker / "out.mp4", tmp_path / "v.mp4", tmp_path / "a.wav")
    (tmp_path / "d.mp4" / "v_a.mp4").mkdir(parents=True)  # a folder is written into, under the default name
    with pytest.raises(InputError, match="v_a.mp4' is a folder"):
        output_path_for(tmp_path / "d.mp4", tmp_path / "v.mp4", tmp_path / "a.wav")
    assert output_path_for(tmp_path / "new" / "o.mp4", tmp_path / "v.mp4", tmp_path / "a.wav").name == "o.mp4"


def test_preload_from_several_threads_loads_each_model_once(tiny_weights, monkeypatch):
    import threading

    from nbhelpers import models
    from nbhelpers.config import InferenceConfig
    from nbhelpers.pipeline import MuseTalkPipeline

    pipe = MuseTalkPipeline.from_pretrained(tiny_weights, InferenceConfig(device="cpu"))
    calls = collections.Counter()
    for name in ("load_unet", "load_vae", "load_whisper"):
        real = getattr(models, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(models, name, counted)
    start = threading.Barrier(3)

    def load():
        start.wait()
        pipe.preload("avatar")

    threads = [threading.Thread(target=load) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == {"load_unet": 1, "load_vae": 1, "load_whisper": 1}
    assert set(pipe.loaded) == {"vae", "face_parser", "unet", "whisper", "feature_extractor", "pe"}
    unet = pipe.unet
    pipe.preload("avatar")  # everything is there: nothing loads again
    assert pipe.unet is unet and sum(calls.values()) == 3


def test_no_model_is_built_while_another_thread_loads_one(tiny_weights, monkeypatch):
    """A VAE load stands in for diffusers' from_pretrained with accelerate installed: while it runs, every
    parameter registered anywhere in the process goes to the meta device (accelerate's init_empty_weights replaces
    torch.nn.Module.register_parameter so). A second thread asks for the face parser meanwhile: it must wait for
    the load and get real weights, equal to those of a parser built alone."""
    import threading

    import torch

    from nbhelpers import models
    from nbhelpers.config import InferenceConfig
    from nbhelpers.parsing import FaceParser
    from nbhelpers.pipeline import MuseTalkPipeline

    pipe = MuseTalkPipeline.from_pretrained(tiny_weights, InferenceConfig(device="cpu"))
    inside, asked = threading.Event(), threading.Event()
    real_register = torch.nn.Module.register_parameter

    def to_meta(module, name, param):
        if param is not None:
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        real_register(module, name, param)

    def patched_vae(*args, **kwargs):
        torch.nn.Module.register_parameter = to_meta
        try:
            inside.set()
            asked.wait(10)
            time.sleep(0.3)  # the other thread, were it not waiting, builds its parser now
            return "vae"
        finally:
            torch.nn.Module.register_parameter = real_register

    monkeypatch.setattr(models, "load_vae", patched_vae)
    loader = threading.Thread(target=lambda: pipe.vae)
    loader.start()
    assert inside.wait(10)
    got = []
    asker = threading.Thread(target=lambda: got.append(pipe.face_parser))
    asker.start()
    asked.set()
    loader.join(20)
    asker.join(60)
    alone = FaceParser(tiny_weights, device="cpu")
    params = dict(got[0].net.named_parameters())
    assert params and all(p.device.type == "cpu" for p in params.values())
    for name, ref in alone.net.named_parameters():
        assert torch.equal(params[name], ref), name


def test_a_pipeline_that_ends_before_its_compile_says_what_was_kept(tiny_weights, monkeypatch):
    """A command-line job ended before its background compile and said nothing: the user could not know that the
    next run compiles again."""
    from nbhelpers import InferenceConfig, MuseTalkPipeline, progress
    from nbhelpers.gpu.compile import CompileStatus

    said = []
    monkeypatch.setattr(progress, "note", said.append)

    class Busy:
        busy = True
        status = CompileStatus("compiling", parts={"unet Bx8x32x32": "compiled", "vae decoder 8x4x32x32": "compiling"})

    with MuseTalkPipeline.from_pretrained(tiny_weights, InferenceConfig(device="cpu")) as pipe:
        pipe._compiler = Busy()
    assert said == ["the background compile did not finish before the job ended (1 of 2 parts compiled). What "
                    "finished is cached for the next run; the rest compiles again then."]
    Busy.busy = False
    with MuseTalkPipeline.from_pretrained(tiny_weights, InferenceConfig(device="cpu")) as pipe:
        pipe._compiler = Busy()
    assert len(said) == 1


def test_warm_up_checks_its_batch_and_does_nothing_on_the_cpu(tiny_weights):
    from nbhelpers.config import InferenceConfig
    from nbhelpers.errors import InputError
    from nbhelpers.pipeline import MuseTalkPipeline

    pipe = MuseTalkPipeline.from_pretrained(tiny_weights, InferenceConfig(device="cpu"))
    for bad in (0, -1, 2.0, True, None):
        with pytest.raises(InputError, match="batch_size must be a positive whole number"):
            pipe.warm_up(bad)
    pipe.warm_up(4)
    assert pipe.loaded == []  # nothing loaded on the CPU
    with pytest.raises(InputError, match="kind must be 'avatar' or 'lipsync'"):
        pipe.preload("realtime")


def test_a_job_asking_fp16_on_a_cpu_pipeline_runs_in_fp32_and_other_clashes_are_refused(tiny_weights):
    """The CLI's --fp16 on a CPU: the planner made the pipeline fp32 (its rule for the CPU), so the job's own fp16 is
    not a clash; another device or version still is. The load says that fp16 is not used (the jobs' plans, given
    the pipeline's fp32, cannot)."""
    from nbhelpers.config import InferenceConfig
    from nbhelpers.errors import InputError
    from nbhelpers.gpu import PlanWarning
    from nbhelpers.pipeline import MuseTalkPipeline

    with pytest.warns(PlanWarning, match="fp16 was asked but the device is the CPU"):
        pipe = MuseTalkPipeline.from_pretrained(tiny_weights, InferenceConfig(device="cpu", fp16=True))
    assert pipe.config.fp16 is False
    assert pipe.job_config(InferenceConfig(device="cpu", fp16=True)).fp16 is False
    with pytest.raises(InputError, match="version="):
        pipe.job_config(InferenceConfig(version="v1"))
