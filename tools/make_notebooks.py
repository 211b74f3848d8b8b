#!/usr/bin/env python
"""Write the workbook's notebooks (notebooks/*.ipynb) from the cell texts below, canonical and without outputs.

    python tools/make_notebooks.py          # (re)write every notebook
    python tools/make_notebooks.py --check  # exit 1 when a committed notebook differs from what this writes

Edit the notebooks here, not in Jupyter: every notebook then keeps the same setup cell, run-mode cell, heading
style and licence line, and the linter (tests/test_notebooks_lint.py) checks the result. Cell ids are derived
from the notebook name and the cell's position, so regenerating an unchanged notebook changes no byte.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"

ORG_REPO = "musetalk-workbook/musetalk-workbook"  # GitHub owner/name of this repository
REPO = f"https://github.com/{ORG_REPO}"
TAG = "v0.1.0"  # the release the notebooks install on Colab

# The first code cell of every notebook (at most 3 lines, identical everywhere). On Colab it installs this
# repository at the pinned release with its [colab] extra (what Colab lacks: floors, never torch), in one pip call
# that fetches nothing else at run time; elsewhere it only imports and reports. get_ipython().run_line_magic is
# %pip in plain Python (a %-line cannot follow `if`).
SETUP_CELL = (
    f'import sys; REPO, TAG = "{REPO}", "{TAG}"  # this workbook, pinned release\n'
    'if "google.colab" in sys.modules: get_ipython().run_line_magic("pip", '
    'f\'install -q "musetalk-workbook[colab] @ git+{REPO}@{TAG}"\')\n'
    "import nbhelpers as nbh; nbh.setup()"
)

# The second code cell of every notebook: the run mode decides where inputs and weights come from.
MODE_CELL = (
    "from nbhelpers import env, ui  # environment helpers, widgets and inline media\n"
    'MODE = env.run_mode()  # "colab", "ci" (the tests set NBHELPERS_MODE=ci) or "local"\n'
    'print(f"Run mode: {MODE}")'
)

SETUP_MD = ("## Set up\n\nRun this first cell: on Colab it installs the workbook at a fixed release without touching "
            "torch, then shows your runtime; elsewhere it only shows it.")
MODE_MD = ("The run mode decides where your inputs and weights come from: `colab`, `local`, or `ci` when the tests "
           "run the notebook with tiny models. Their weights are random, so in `ci` mode every repainted mouth is "
           "colour noise: that is expected.")
PARAMS_MD = ("## Choose your parameters\n\nPut your own values here; when you leave them empty, you get the "
             "samples. Papermill and the tests replace this cell (it is tagged `parameters`).")

LICENCES_MEDIA = (
    "**Media licences:** sample photo `astronaut.png`: Eileen Collins, NASA, public domain (shipped in "
    "scikit-image); sample speech `demo-speech.wav`: synthesised with espeak-ng by this project, free to use "
    "(see `nbhelpers/data/README.md`). In CI mode the tests use clips of `face-sing-576x768-25fps.mp4`, "
    "`speech-en-short.wav` and `sing-44k1-mono.wav` from the project's test media (test use only, not "
    "redistributed). Your own files stay yours."
)


def badge(name: str) -> str:
    """The Open-in-Colab badge of ``notebooks/<name>.ipynb``."""
    return (f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"(https://colab.research.google.com/github/{ORG_REPO}/blob/main/notebooks/{name}.ipynb)")


def md(text: str) -> tuple[str, str, tuple[str, ...]]:
    return ("markdown", text.strip(), ())


def code(text: str, *tags: str) -> tuple[str, str, tuple[str, ...]]:
    return ("code", text.strip(), tuple(tags))


def opening(name: str, title: str, intro: str, media: bool, params: str) -> list:
    """Title, badge, intro (and licence line), the setup cell, the run-mode cell and the parameters cell."""
    head = f"# {title}\n\n{badge(name)}\n\n{intro.strip()}"
    if media:
        head += f"\n\n{LICENCES_MEDIA}"
    return [md(head), md(SETUP_MD), code(SETUP_CELL), md(MODE_MD), code(MODE_CELL), md(PARAMS_MD),
            code(params, "parameters")]


IGNORE = "nbval-ignore-output"  # cells whose output is a progress bar, a timing or machine-dependent
SKIP = "nbval-skip"  # cells that need what CI mode lacks (optional weights and packages)

# ---------------------------------------------------------------------------------------------------------------

SETUP_NB = opening(
    "00_setup", "Set up your runtime",
    "This notebook checks that your runtime can run MuseTalk: a GPU, the few packages Colab lacks, a landmark "
    "backend and, if you want them, the exact official landmarks and Google Drive. Run it once per Colab session; "
    "the other notebooks also set up what they need by themselves.",
    media=False,
    params='MOUNT_DRIVE = False  # True mounts Google Drive (Colab asks for your permission)\n'
           'DRIVE_WEIGHTS = ""  # a Drive folder holding the weights, e.g. "/content/drive/MyDrive/musetalk-weights"\n'
           "MMPOSE = False  # True installs mmcv, mmengine and mmpose for the exact official landmarks (slow)",
) + [
    md("## Check the GPU\n\nMuseTalk needs a CUDA GPU, so this cell stops a CPU-only runtime before you download "
       "anything. If it stops, choose *Runtime > Change runtime type > T4 GPU* and run your notebook again."),
    code('from nbhelpers import gpu\ngpu.check_gpu(allow_cpu=True if MODE == "ci" else None)  # None: NBHELPERS_ALLOW_CPU decides'),
    md("The planner reads your GPU's free memory and chooses the precision and the batch size for you; every later "
       "notebook asks it again."),
    code('env.plan("lipsync", MODE)', IGNORE),
    md("## Install what is missing\n\nColab already has torch, numpy and transformers, so the first cell "
       "installed only the light packages it lacks (the package's `[colab]` extra), at their minimum versions, and "
       "upgraded nothing protected. This table checks each one again and installs any still missing; outside Colab "
       "you only see what is missing."),
    code('env.install_missing(dry_run=MODE != "colab")  # the [colab] extra: what Colab lacks', IGNORE),
    md("If your table ends with a red restart line, choose *Runtime > Restart session* and run your notebook "
       "again from the top."),
    md("## Choose the landmark backend\n\nLandmarks place the crop box on your face. With `auto` you get mmpose "
       "when it is installed, else DWPose in torch (`dwpose`: the official weights, on your GPU in half precision, "
       "nothing extra to install), else DWPose in ONNX when onnxruntime and its file are there, else dlib; CI mode "
       "uses dlib, which needs no download. The line below says which one runs and why."),
    code('from nbhelpers import faces\nbackend = faces.get_backend("dlib" if MODE == "ci" else "auto")\n'
         'print(backend.name, "-", backend.reason)'),
    md("## Optional: the exact official landmarks\n\nThe official pipeline finds landmarks with mmpose, which "
       "needs mmcv, and prebuilt mmcv wheels exist only for some torch and CUDA versions. This check tells you "
       "whether your runtime has them, and how long an install would take."),
    code("from nbhelpers.faces import mim\nmim.check_mmcv_wheels()", IGNORE),
    md("Set `MMPOSE = True` in your parameters to install them: the install then verifies mmpose with one "
       "landmark pass in a fresh interpreter and reports how long it took. Otherwise you see the plan only, and "
       "the default `dwpose` backend (DWPose in torch) gives you the same landmarks without mmcv."),
    code('from nbhelpers.faces import mim\nmim.install_mmpose(dry_run=not MMPOSE or MODE == "ci")', IGNORE),
    md("## Optional: Google Drive\n\nMount Drive to keep your weights and results between sessions. In a workshop "
       "your teacher shares one weights folder: add a shortcut to it in *My Drive*, put its path in "
       "`DRIVE_WEIGHTS`, and you never download the weights yourself."),
    code("env.mount_drive(DRIVE_WEIGHTS, enabled=MOUNT_DRIVE)"),
    md("## Check\n\nThe last cell checks that your runtime is ready: every requirement is satisfied now, torch "
       "imports, ffmpeg runs and a landmark backend is found. It needs no earlier cell to have worked, and if "
       "something is missing, it says how to fix it."),
    code('env.check_setup(backend="dlib" if MODE == "ci" else "auto")  # reads everything again itself'),
]

WEIGHTS_NB = opening(
    "01_weights", "Download and verify the weights",
    "You download the official MuseTalk weights (about 4.2 GB) once and check every file. In CI mode you get a "
    "tiny random-weights tree in the same layout instead, because the model hub is out of reach there.",
    media=False,
    params='SETS = None  # weight sets to download; None = what MuseTalk 1.5 needs, "all" adds v1.0 and mmpose',
) + [
    md("## Where your weights go\n\nYour weights folder comes from `NBHELPERS_WEIGHTS` (a Drive folder in a "
       "workshop), else a Drive or cache folder; CI mode makes a tiny tree."),
    code("from nbhelpers import weights\nWEIGHTS = env.weights_dir(MODE, download=False)\nWEIGHTS"),
    md("## What you download\n\nThis table lists each file you need, its size and where it comes from."),
    code("weights.list_files(SETS or \"default\")"),
    md("## Download\n\nYou download only what is missing: files already present are checked and kept, and a "
       "broken file is fetched again. The tiny CI tree is complete already, so nothing is fetched there."),
    code("weights.download(WEIGHTS, sets=SETS)", IGNORE),
    md("## Verify\n\nVerifying opens every file you have and checks its size and contents against the manifest."),
    code("report = weights.verify(WEIGHTS)\nreport"),
    md("## Check\n\nThe last cell checks that your verification table has rows and no problem."),
    code("report.raise_for_problems()\nenv.check_result(report)"),
]

MEDIA_NB = opening(
    "02_media", "Bring your video and audio",
    "You upload a video (or a photo) of one face and a speech recording, look at what they contain, and convert "
    "the video to the 25 frames per second MuseTalk needs. The later notebooks pick up what you leave here; "
    "without it they use the samples.",
    media=True,
    params='VIDEO = ""  # a path to your video or photo (e.g. on Drive); empty: upload, else the sample\n'
           'AUDIO = ""  # a path to your speech (wav, mp3, m4a...); empty: upload, else the sample',
) + [
    md("## Upload\n\nIn Colab this opens a file picker: choose your video or photo and your audio together. "
       "Elsewhere nothing opens, so you put your paths in the parameters cell instead."),
    code("uploads = env.upload(MODE)\nuploads"),
    md("Your files win over the samples: a path you typed first, then an upload, then the demo photo and speech."),
    code("video, audio = env.workbook_inputs(MODE, VIDEO, AUDIO, uploads=uploads)\nprint(video, audio, sep=\"\\n\")"),
    md("## Probe\n\nProbing reads your video's size, frame rate, duration and streams without decoding it."),
    code("from nbhelpers import media\nmedia.probe(video)"),
    md("Check your audio the same way; MuseTalk resamples any format to 16 kHz mono for you."),
    code("media.probe(audio)"),
    md("## Convert to 25 fps\n\nMuseTalk works at 25 frames per second, so you convert your video once here; a "
       "photo becomes a one-frame clip."),
    code("converted = media.convert_to_25fps(video, env.media_dir(MODE) / env.WORKBOOK_VIDEO)\nconverted"),
    md("Keep a copy of your audio beside it, so that your next notebooks find both."),
    code("kept_audio = env.keep_audio(audio, MODE)\nkept_audio"),
    md("## Preview\n\nWatch your converted video before you spend GPU time on it."),
    code("ui.show_video(converted.path)"),
    md("Listen to your audio as well."),
    code("ui.show_audio(kept_audio)"),
    md("## Check\n\nThe last cell checks that your converted file was written now and lasts as long as your video."),
    code("env.check_result(converted, duration_s=media.probe(video).duration_s)"),
]

AVATAR_NB = opening(
    "03_avatar", "Prepare an avatar",
    "An avatar is everything MuseTalk computes once per video: face boxes, latents and blend masks. You preview "
    "the first frame, prepare the avatar, and look at its boxes and masks over your frames before any long run.",
    media=True,
    params='VIDEO = ""  # your video or photo; empty: the one from 02_media, else the sample\n'
           'SETTINGS = {}  # panel values for a run with no person at the controls, e.g. {"extra_margin": 20}',
) + [
    md("## Inputs and weights\n\nYou take your video from 02_media (or the sample) and your weights, downloading "
       "what is missing."),
    code("video, _ = env.workbook_inputs(MODE, VIDEO)\nWEIGHTS = env.weights_dir(MODE)\nvideo"),
    md("## Settings\n\nThe planner picks the device, precision and batch size for your GPU, and the panel lets you "
       "change them and the face settings. The controls only set values: after a change, run the next cell."),
    code('panel = ui.settings_panel(env.plan("avatar", MODE), values=SETTINGS)\npanel', IGNORE),
    md("## Load the pipeline\n\nThe pipeline holds the models on your device, in the precision you chose. Each "
       "model loads the first time a step needs it and then stays, so the preview, the avatar and every later run "
       "reuse it. After changing the version or the precision in the panel, run this cell again."),
    code("pipe = nbh.MuseTalkPipeline.from_pretrained(WEIGHTS, config=panel.config)\npipe"),
    md("## Preview the first frame\n\nBefore the full run, you see on your first frame the crop box, the landmarks, "
       "the blend mask and the repainted mouth."),
    code("pipe.preview(video, config=panel.config)"),
    md("## Prepare\n\nPreparing reads every frame once and stores the faces, latents and masks in your avatar "
       "folder, with a progress bar per stage."),
    code('AVATAR_DIR = env.work_dir(MODE) / "avatars" / "my-avatar"\n'
         "avatar = pipe.prepare_avatar(video, AVATAR_DIR, config=panel.config)\navatar", IGNORE),
    md("## Look at the boxes and masks\n\nEach panel shows one of your frames with its crop box (green) and the "
       "blend mask (red) where the mouth is repainted."),
    code("ui.plot_faces(video, avatar)"),
    md("## Load it again\n\nPreparing again with the same settings loads your avatar from its folder instead of "
       "recomputing it."),
    code("again = pipe.prepare_avatar(video, AVATAR_DIR, config=panel.config)\nagain", IGNORE),
    md("## Check\n\nThe last cell checks that your second call loaded the cache."),
    code("env.check_result(again, from_cache=True)"),
]

LIPSYNC_NB = opening(
    "04_lipsync", "Lip-sync a video",
    "You run the offline job: your video and speech in, the same video out at 25 fps with the mouth following "
    "the speech. You see progress per stage, a chart of where the time went, and the result beside your source.",
    media=True,
    params='VIDEO = ""  # your video or photo; empty: the one from 02_media, else the sample\n'
           'AUDIO = ""  # your speech; empty: the one from 02_media, else the sample\n'
           'SETTINGS = {}  # panel values for a run with no person at the controls, e.g. {"extra_margin": 20}',
) + [
    md("## Inputs and weights\n\nYou take your video and audio from 02_media (or the samples) and your weights, "
       "downloading what is missing."),
    code("video, audio = env.workbook_inputs(MODE, VIDEO, AUDIO)\nWEIGHTS = env.weights_dir(MODE)\nvideo, audio"),
    md("## Settings\n\nThe planner picks the device, precision and batch size for your GPU, and the panel lets you "
       "change them and the face settings. The controls only set values: after a change, run the next cell."),
    code('panel = ui.settings_panel(env.plan("lipsync", MODE), values=SETTINGS)\npanel', IGNORE),
    md("## Load the pipeline\n\nThe pipeline holds the models on your device, in the precision you chose. They load "
       "during your first run and stay, so running again with other face settings starts at once. After changing "
       "the version or the precision in the panel, run this cell again."),
    code("pipe = nbh.MuseTalkPipeline.from_pretrained(WEIGHTS, config=panel.config)\npipe"),
    md("## Run\n\nThis runs every stage with a progress bar: faces, latents, parsing, generation, paste-back and "
       "encoding. Your result plays here when it is done."),
    code('result = pipe.lipsync(video, audio, env.work_dir(MODE) / "lipsync.mp4", config=panel.config)\nresult',
         IGNORE),
    md("## Where the time went\n\nThe chart shows the seconds each stage took on your runtime."),
    code("ui.plot_timings(result.timings)", IGNORE),
    md("## Compare\n\nWatch your source and your result side by side."),
    code("ui.side_by_side(video, result)"),
    md("## Is it in sync?\n\nYou check that the mouth in your result follows the voice: its opening against the "
       "speech loudness, frame by frame, and the lag where they agree best. Read the verdict before the lag: a "
       "mouth that barely moves gives a lag that means nothing."),
    code("sync = nbh.quality.mouth_audio_lag(result.output, backend=panel.config.landmark_backend, "
         "weights_dir=WEIGHTS)\nsync"),
    md("With the optional `quality` weights (`python -m nbhelpers download --sets quality`), SyncNet gives you the "
       "field's scores for your result: LSE-D (lower is better) and LSE-C (higher is better)."),
    code("nbh.quality.sync_score(result.output, weights_dir=WEIGHTS) if (WEIGHTS / nbh.quality.SYNCNET_FILE).is_file() "
         "else \"SyncNet weights missing: python -m nbhelpers download --sets quality\""),
    md("## Restore the face (optional)\n\nMuseTalk repaints a 256-pixel crop, so the mouth can look soft on "
       "close-ups. You can pick a face restorer in the panel (*face restoration*) and run again; CodeFormer is for "
       "non-commercial use only. The next cell installs spandrel and fetches your restorer's weights."),
    code('RESTORER = panel.config.restore or "gfpgan"\n'
         'env.install_missing(["spandrel>=0.4", "spandrel-extra-arches>=0.2"])\n'
         'nbh.weights.download(WEIGHTS, sets=f"restore-{RESTORER}")', SKIP, IGNORE),
    md("You repaint one frame without and with the restorer, side by side."),
    code("ui.compare_restore(*(pipe.preview(video, config=panel.config.replace(restore=r), audio=audio)\n"
         "                     for r in (None, RESTORER)))", SKIP, IGNORE),
    md("## Dub many clips at once\n\nA batch runs many (video, audio) jobs on Ray: the models load once per GPU, "
       "each face is prepared once, a clip that fails is recorded without stopping the others, and running the "
       "batch again skips finished outputs. It needs Ray (`%pip install \"ray>=2.10\"`); without it you see the "
       "install line."),
    code("from nbhelpers import batch\n"
         'jobs = [{"video": video, "audio": audio, "output": env.work_dir(MODE) / "batch" / f"clip{k}.mp4"} '
         "for k in range(2)]\n"
         "batch.run(jobs, config=panel.config, weights_dir=WEIGHTS) if batch.ray_installed() else batch.INSTALL_RAY",
         IGNORE),
    md("## Check\n\nThe last cell checks that your output was written now and lasts as long as your audio, within "
       "one frame."),
    code("env.check_result(result, duration_s=env.media_seconds(audio))"),
]

REALTIME_NB = opening(
    "05_realtime", "Make several clips from one avatar",
    "Once your avatar is prepared, each new speech clip needs only the audio features, the UNet, the VAE decoder, "
    "the paste-back and the encoder: this is the realtime path. You make several clips and compare the generation "
    "speed with the speed you actually wait for.",
    media=True,
    params='VIDEO = ""  # your video or photo; empty: the one from 02_media, else the sample\n'
           "AUDIOS = []  # paths of your speech clips; empty: two samples\n"
           'SETTINGS = {}  # panel values for a run with no person at the controls, e.g. {"extra_margin": 20}',
) + [
    md("## Inputs and weights\n\nYou take your video from 02_media (or the sample), two speech clips and your "
       "weights, downloading what is missing."),
    code("video, _ = env.workbook_inputs(MODE, VIDEO)\naudios = AUDIOS or env.sample_audios(MODE)\n"
         "WEIGHTS = env.weights_dir(MODE)"),
    md("## Settings\n\nThe planner picks the realtime batch size for your GPU; the controls only set values, so "
       "after a change you run the next cell."),
    code('panel = ui.settings_panel(env.plan("realtime", MODE), values=SETTINGS)\npanel', IGNORE),
    md("## Load the pipeline\n\nThe pipeline holds the models on your device; your avatar generates every clip "
       "with them."),
    code("pipe = nbh.MuseTalkPipeline.from_pretrained(WEIGHTS, config=panel.config)\npipe"),
    md("## Prepare or load the avatar\n\nIf you prepared this video in 03_avatar with the same settings, your "
       "avatar loads from its folder in seconds."),
    code('avatar = pipe.prepare_avatar(video, env.work_dir(MODE) / "avatars" / "my-avatar", config=panel.config)\n'
         "avatar", IGNORE),
    md("## Load the models\n\nYou load the models once for all your clips, so the speeds below measure only the "
       "work each clip needs."),
    code("avatar.load_models()", IGNORE),
    md("## Speed up (optional)\n\nOn a GPU you can make every later clip faster: your avatar switches to "
       "channels-last weights, and with `compile=True` you pay a one-time compile of about 90 s. On a CPU this "
       "does nothing."),
    code("avatar.optimize(compile=False)  # True on a GPU: about 90 s once, then about 2x faster model work", IGNORE),
    md("## Generate\n\nEach clip reuses your avatar's latents and masks, so only the audio-dependent work runs."),
    code('clips = [avatar.generate(a, env.work_dir(MODE) / f"clip-{i}.mp4") for i, a in enumerate(audios)]', IGNORE),
    md("## Speed\n\nGeneration fps counts the model work only; end-to-end fps counts what you wait for, from audio "
       "in to file closed. Real time is 25 fps."),
    code("ui.fps_table(clips)", IGNORE),
    md("## Watch\n\nPlay your last clip."),
    code("ui.show_video(clips[-1])"),
    md("## Live\n\nA live session takes speech in chunks, as a voice synthesiser sends it, and hands out each "
       "frame at 25 fps once its audio context is there. You play the first 2 s of your first clip in 200 ms chunks, "
       "as if it arrived now, and see the first-frame latency and whether any frame was late."),
    code("from nbhelpers import live, media\nsession = avatar.live(realtime=True, on_frame=lambda n, frame: None)\n"
         "live.play(session, media.load_audio(audios[0])[: 2 * 16000], chunk_ms=200)", IGNORE),
    md("## Check\n\nThe last cell checks that each of your clips was written now and lasts as long as its audio."),
    code("[env.check_result(c, duration_s=env.media_seconds(a)) for c, a in zip(clips, audios, strict=True)]"),
]

QUICKSTART_NB = [
    md(f"# Quickstart: lip-sync in five cells\n\n{badge('quickstart')}\n\nYou run the whole workbook in five "
       "cells: set up, choose your files, lip-sync, and check. Each step has its own notebook, from 00_setup to "
       f"05_realtime, when you want to see more.\n\n{LICENCES_MEDIA}"),
    md(SETUP_MD),
    code(SETUP_CELL),
    md(MODE_MD),
    code(MODE_CELL),
    md("## Choose your files\n\nPut the paths of your video (or photo) and speech here, or leave them empty for "
       "the samples. Papermill and the tests replace this cell (it is tagged `parameters`)."),
    code('VIDEO = ""  # your video or photo, e.g. "/content/drive/MyDrive/face.mp4"; empty: the sample\n'
         'AUDIO = ""  # your speech; empty: the sample', "parameters"),
    md("## Lip-sync\n\nThis downloads the weights you are missing, runs every stage and plays your result here."),
    code("video, audio = env.workbook_inputs(MODE, VIDEO, AUDIO)\n"
         'result = nbh.lipsync(video, audio, env.work_dir(MODE) / "quickstart.mp4", config=env.default_config(MODE), '
         "weights_dir=env.weights_dir(MODE))\nresult", IGNORE),
    md("## Check\n\nThe last cell checks that your video was written now with one frame per 1/25 s of your audio."),
    code("env.check_result(result, duration_s=env.media_seconds(audio))"),
]

BOOK = {
    "00_setup": SETUP_NB,
    "01_weights": WEIGHTS_NB,
    "02_media": MEDIA_NB,
    "03_avatar": AVATAR_NB,
    "04_lipsync": LIPSYNC_NB,
    "05_realtime": REALTIME_NB,
    "quickstart": QUICKSTART_NB,
}


def build(name: str, cells: list) -> nbformat.NotebookNode:
    """A notebook (nbformat 4.5) of ``cells`` with deterministic ids, Colab's GPU hint and no outputs."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "accelerator": "GPU",
        "colab": {"gpuType": "T4", "provenance": []},
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for i, (kind, text, tags) in enumerate(cells):
        cell = nbformat.v4.new_markdown_cell(text) if kind == "markdown" else nbformat.v4.new_code_cell(text)
        cell.id = f"{name.replace('_', '-')}-{i:02d}"
        if tags:
            cell.metadata["tags"] = list(tags)
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(name: str) -> str:
    """The canonical file text of notebook ``name`` (what nbformat.write would write)."""
    return nbformat.writes(build(name, BOOK[name])) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when a notebook is stale")
    args = parser.parse_args(argv)
    stale = []
    for name in BOOK:
        path = NOTEBOOKS / f"{name}.ipynb"
        text = render(name)
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path.relative_to(ROOT).as_posix())
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if args.check and stale:
        print("stale (run python tools/make_notebooks.py):", *stale, sep="\n  ")
        return 1
    print(("stale: " if args.check else "written: ") + (", ".join(stale) or "none"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
