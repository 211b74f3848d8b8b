# %% [markdown]
# # Prepare an avatar
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/musetalk-workbook/musetalk-workbook/blob/main/notebooks/03_avatar.ipynb)
#
# An avatar is everything MuseTalk computes once per video: face boxes, latents and blend masks. You preview the first frame, prepare the avatar, and look at its boxes and masks over your frames before any long run.
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
SETTINGS = {}  # panel values for a run with no person at the controls, e.g. {"extra_margin": 20}

# %% [markdown]
# ## Inputs and `weights`
#
# You take your video from 02_media (or the sample) and your weights, downloading what is missing.

# %%
video, _ = nbh.env.workbook_inputs(MODE, VIDEO)
WEIGHTS = nbh.workbook.weights()
video

# %% [markdown]
# ## Settings (`ui`, `gpu`)
#
# The planner picks the device, precision and batch size for your GPU, and the panel lets you change them and the face settings. The controls only set values: after a change, run the next cell.

# %% tags=["nbval-ignore-output"]
panel = nbh.ui.settings_panel(nbh.workbook.plan("avatar"), values=SETTINGS)
panel

# %% [markdown]
# ## Load the `pipeline`
#
# The pipeline holds the models on your device, in the precision you chose. Each model loads the first time a step needs it and then stays, so the preview, the avatar and every later run reuse it. After changing the version or the precision in the panel, run this cell again.

# %%
pipe = nbh.MuseTalkPipeline.from_pretrained(WEIGHTS, config=panel.config)
pipe

# %% [markdown]
# ## Preview the first frame
#
# Before the full run, you see on your first frame the crop box, the landmarks, the blend mask and the repainted mouth.

# %%
pipe.preview(video, config=panel.config)

# %% [markdown]
# ## Prepare the `avatar`
#
# Preparing reads every frame once and stores the faces, latents and masks in your avatar folder, with a progress bar per stage.

# %% tags=["nbval-ignore-output"]
AVATAR_DIR = nbh.workbook.path("avatars", "my-avatar")
avatar = nbh.prepare_avatar(video, AVATAR_DIR, pipe, config=panel.config)
avatar

# %% [markdown]
# ## Look at the boxes and masks
#
# Each panel shows one of your frames with its crop box (green) and the blend mask (red) where the mouth is repainted.

# %%
nbh.ui.plot_faces(video, avatar)

# %% [markdown]
# ## Several faces (`faces`)
#
# When your video shows more than one person, `pipe.faces(video)` lists every face as a numbered track with a thumbnail, and the plot draws each track's box in its colour. Set `face` in the config to a track number, or a point `"x,y"` on a face in the first frame, to repaint that face only; `"speaker"` follows the voice in a lip-sync. Your choice below takes track 0, which in a one-face video is the face the default `largest` takes.

# %% tags=["nbval-ignore-output"]
tracks = pipe.faces(video, config=panel.config)
tracks

# %% [markdown]
# Each track's box is drawn dashed in its colour, with its number, over two of your frames.

# %%
nbh.ui.plot_faces(video, tracks, max_frames=2)

# %% [markdown]
# The panel's `face` box takes the same choice (type `0` there, then run the cells below it again). Here a copy of your settings takes the first track, so your avatar above stays as it is.

# %%
chosen = panel.config.replace(face=tracks.tracks[0].number)
chosen.face

# %% [markdown]
# ## Load it again
#
# Preparing again with the same settings loads your avatar from its folder instead of recomputing it.

# %% tags=["nbval-ignore-output"]
again = nbh.prepare_avatar(video, AVATAR_DIR, pipe, config=panel.config)
again

# %% [markdown]
# ## Check
#
# The last cell checks that your second call loaded the cache.

# %%
nbh.workbook.check(again, from_cache=True)
