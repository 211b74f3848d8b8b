# %% [markdown]
# # Make several clips from one avatar
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/musetalk-workbook/musetalk-workbook/blob/main/notebooks/05_realtime.ipynb)
#
# Once your avatar is prepared, each new speech clip needs only the audio features, the UNet, the VAE decoder, the paste-back and the encoder: this is the realtime path. You make several clips and compare the generation speed with the speed you actually wait for.
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
AUDIOS = []  # paths of your speech clips; empty: two samples
SETTINGS = {}  # panel values for a run with no person at the controls, e.g. {"extra_margin": 20}

# %% [markdown]
# ## Inputs and `weights`
#
# You take your video from 02_media (or the sample), two speech clips and your weights, downloading what is missing.

# %%
video, _ = nbh.env.workbook_inputs(MODE, VIDEO)
audios = AUDIOS or nbh.env.sample_audios(MODE)
WEIGHTS = nbh.workbook.weights()

# %% [markdown]
# ## Settings (`ui`, `gpu`)
#
# The planner picks the realtime batch size for your GPU; the controls only set values, so after a change you run the next cell.

# %% tags=["nbval-ignore-output"]
panel = nbh.ui.settings_panel(nbh.workbook.plan("realtime"), values=SETTINGS)
panel

# %% [markdown]
# ## Load the `pipeline`
#
# The pipeline holds the models on your device; your avatar generates every clip with them.

# %%
pipe = nbh.MuseTalkPipeline.from_pretrained(WEIGHTS, config=panel.config)
pipe

# %% [markdown]
# ## Prepare or load the `avatar`
#
# If you prepared this video in 03_avatar with the same settings, your avatar loads from its folder in seconds.

# %% tags=["nbval-ignore-output"]
avatar = nbh.prepare_avatar(video, nbh.workbook.path("avatars", "my-avatar"), pipe, config=panel.config)
avatar

# %% [markdown]
# ## Load the models
#
# You load the models once for all your clips, so the speeds below measure only the work each clip needs.

# %% tags=["nbval-ignore-output"]
avatar.load_models()

# %% [markdown]
# ## Speed up
#
# On a GPU the UNet and VAE are compiled for your GPU in the background while your first clip runs eagerly; the
# compiled code is cached beside your weights, so a later session starts fast. Run this cell to wait until it is
# ready (minutes the first time on a free Colab, seconds after); on a CPU it returns at once.

# %% tags=["nbval-ignore-output"]
avatar.optimize()

# %% [markdown]
# ## Generate
#
# Each clip reuses your avatar's latents and masks, so only the audio-dependent work runs.

# %% tags=["nbval-ignore-output"]
clips = [avatar.generate(a, nbh.workbook.path(f"clip-{i}.mp4")) for i, a in enumerate(audios)]

# %% [markdown]
# ## Speed
#
# Generation fps counts the model work only; end-to-end fps counts what you wait for, from audio in to file closed. Real time is 25 fps.

# %% tags=["nbval-ignore-output"]
nbh.ui.fps_table(clips)

# %% [markdown]
# ## Watch
#
# Play your last clip.

# %%
nbh.ui.show_video(clips[-1])

# %% [markdown]
# ## Live (`live`)
#
# A live session takes speech in chunks, as a voice synthesiser sends it, and hands out each frame at 25 fps once its audio context is there. You play the first 2 s of your first clip in 200 ms chunks, as if it arrived now, and see the first-frame latency and whether any frame was late.

# %% tags=["nbval-ignore-output"]
session = nbh.live.LiveSession(avatar, nbh.live.LiveConfig(realtime=True), on_frame=lambda n, frame: None)
nbh.live.play(session, nbh.media.load_audio(audios[0])[: 2 * 16000], chunk_ms=200)

# %% [markdown]
# ## Check
#
# The last cell checks that each of your clips was written now and lasts as long as its audio.

# %%
[nbh.workbook.check(c, audio=a) for c, a in zip(clips, audios, strict=True)]
