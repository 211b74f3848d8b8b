# %% [markdown]
# # Lip-sync a video
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/musetalk-workbook/musetalk-workbook/blob/main/notebooks/04_lipsync.ipynb)
#
# You run the offline job: your video and speech in, the same video out at 25 fps with the mouth following the speech. You see progress per stage, a chart of where the time went, and the result beside your source.
#
# **Media licences:** sample photo `astronaut.png`: Eileen Collins, NASA, public domain (shipped in scikit-image); sample speech `demo-speech.wav`: synthesised with espeak-ng by this project, free to use (see `nbhelpers/data/README.md`). In CI mode the tests use clips of `face-sing-576x768-25fps.mp4`, `speech-en-short.wav` and `sing-44k1-mono.wav` from the project's test media (test use only, not redistributed). Your own files stay yours.

# %% [markdown]
# ## Set up
#
# Run this first cell: on Colab it installs the workbook from its main branch without touching torch; elsewhere it does nothing: install the workbook once with `bash tools/install.sh dlib` in its repository (README, *On a fresh machine*) and choose that environment's kernel, or you get `No module named 'nbhelpers'` in the next cell.

# %%
import subprocess, sys
WORKBOOK = "musetalk-workbook[colab] @ git+https://github.com/musetalk-workbook/musetalk-workbook@main"
if "google.colab" in sys.modules:  # on Colab: install this workbook (torch stays as it is)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", WORKBOOK], check=True)

# %% [markdown]
# You import the package as `nbh`; its run mode decides where your inputs and weights come from: `colab`, `local`, or `ci` when the tests run the notebook with tiny random weights (every repainted mouth is then colour noise). The table shows your runtime.

# %%
import nbhelpers as nbh  # the workbook's package: pipeline, media, widgets and plots
MODE = nbh.env.run_mode()  # "colab", "ci" (the tests set NBHELPERS_MODE=ci) or "local"
nbh.setup(MODE)  # your runtime: GPU, versions, weights folder

# %% [markdown]
# ## Choose your parameters
#
# Put your own values here; when you leave them empty, you get the samples. Papermill and the tests replace this cell (it is tagged `parameters`).

# %% tags=["parameters"]
VIDEO = ""  # your video or photo; empty: the one from 02_media, else the sample
AUDIO = ""  # your speech; empty: the one from 02_media, else the sample
SETTINGS = {}  # panel values for a run with no person at the controls, e.g. {"extra_margin": 20}

# %% [markdown]
# ## Inputs and `weights`
#
# You take your video and audio from 02_media (or the samples) and your weights, downloading what is missing.

# %%
video, audio = nbh.env.workbook_inputs(MODE, VIDEO, AUDIO)
WEIGHTS = nbh.workbook.weights()
video, audio

# %% [markdown]
# ## Settings (`ui`, `gpu`)
#
# The planner picks the device, precision and batch size for your GPU, and the panel lets you change them and the face settings. The controls only set values: after a change, run the next cell.

# %% tags=["nbval-ignore-output"]
panel = nbh.ui.settings_panel(nbh.workbook.plan("lipsync"), values=SETTINGS)
panel

# %% [markdown]
# ## Load the `pipeline`
#
# The pipeline holds the models on your device, in the precision you chose. They load during your first run and stay, so running again with other face settings starts at once. After changing the version or the precision in the panel, run this cell again.

# %%
pipe = nbh.MuseTalkPipeline.from_pretrained(WEIGHTS, config=panel.config)
pipe

# %% [markdown]
# ## Run
#
# This runs every stage with a progress bar: faces, latents, parsing, generation, paste-back and encoding. Your result plays here when it is done.

# %% tags=["nbval-ignore-output"]
result = pipe.lipsync(video, audio, nbh.workbook.path("lipsync.mp4"), config=panel.config)
result

# %% [markdown]
# ## Where the time went
#
# The chart shows the seconds each stage took on your runtime.

# %% tags=["nbval-ignore-output"]
nbh.ui.plot_timings(result.timings)

# %% [markdown]
# ## Compare
#
# Watch your source and your result side by side.

# %%
nbh.ui.side_by_side(video, result)

# %% [markdown]
# ## Is it in sync? (`quality`)
#
# You check that the mouth in your result follows the voice: its opening against the speech loudness, frame by frame, and the lag where they agree best. Read the verdict before the lag: a mouth that barely moves gives a lag that means nothing.

# %%
sync = nbh.quality.mouth_audio_lag(result.output, backend=panel.config.landmark_backend, weights_dir=WEIGHTS)
nbh.ui.plot_sync(sync)

# %% [markdown]
# With the optional `quality` weights (`python -m nbhelpers download --sets quality`), SyncNet gives you the field's scores for your result: LSE-D (lower is better) and LSE-C (higher is better).

# %%
nbh.quality.sync_score(result.output, weights_dir=WEIGHTS) if (WEIGHTS / nbh.quality.SYNCNET_FILE).is_file() else "SyncNet weights missing: python -m nbhelpers download --sets quality"

# %% [markdown]
# ## Restore the face (optional, `restore`)
#
# MuseTalk repaints a 256-pixel crop, so the mouth can look soft on close-ups. You can pick a face restorer in the panel (*face restoration*) and run again; CodeFormer is for non-commercial use only. The next cell installs spandrel and fetches your restorer's weights.

# %% tags=["nbval-skip", "nbval-ignore-output"]
RESTORER = panel.config.restore or "gfpgan"
nbh.workbook.install_missing(["spandrel>=0.4", "spandrel-extra-arches>=0.2"])
nbh.weights.download(WEIGHTS, sets=f"restore-{RESTORER}")

# %% [markdown]
# You repaint one frame without and with the restorer, side by side.

# %% tags=["nbval-skip", "nbval-ignore-output"]
nbh.ui.compare_restore(*(pipe.preview(video, config=panel.config.replace(restore=r), audio=audio)
                     for r in (None, RESTORER)))

# %% [markdown]
# ## Dub many clips at once (`batch`)
#
# A batch runs many (video, audio) jobs on Ray: the models load once per GPU, each face is prepared once, a clip that fails is recorded without stopping the others, and running the batch again skips finished outputs. It needs Ray (`%pip install "ray>=2.10"`); without it you see the install line.

# %% tags=["nbval-ignore-output"]
jobs = [{"video": video, "audio": audio, "output": nbh.workbook.path("batch", f"clip{k}.mp4")} for k in range(2)]
nbh.batch.run(jobs, inference=panel.config, weights_dir=WEIGHTS) if nbh.batch.ray_installed() else nbh.batch.INSTALL_RAY

# %% [markdown]
# ## Check
#
# The last cell checks that your output was written now and lasts as long as your audio, within one frame.

# %%
nbh.workbook.check(result, audio=audio)
