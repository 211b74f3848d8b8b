# %% [markdown]
# # Bring your video and audio
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/musetalk-workbook/musetalk-workbook/blob/main/notebooks/02_media.ipynb)
#
# You upload a video (or a photo) of one face and a speech recording, look at what they contain, and convert the video to the 25 frames per second MuseTalk needs. The later notebooks pick up what you leave here; without it they use the samples.
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
VIDEO = ""  # a path to your video or photo (e.g. on Drive); empty: upload, else the sample
AUDIO = ""  # a path to your speech (wav, mp3, m4a...); empty: upload, else the sample

# %% [markdown]
# ## Upload
#
# In Colab this opens a file picker: choose your video or photo and your audio together. Elsewhere nothing opens, so you put your paths in the parameters cell instead.

# %%
uploads = nbh.env.upload(MODE)
uploads

# %% [markdown]
# Your files win over the samples: a path you typed first, then an upload, then the demo photo and speech.

# %%
video, audio = nbh.env.workbook_inputs(MODE, VIDEO, AUDIO, uploads=uploads)
print(video, audio, sep="\n")

# %% [markdown]
# ## Probe with `media`
#
# Probing reads your video's size, frame rate, duration and streams without decoding it.

# %%
nbh.media.probe(video)

# %% [markdown]
# Check your audio the same way; MuseTalk resamples any format to 16 kHz mono for you.

# %%
nbh.media.probe(audio)

# %% [markdown]
# ## Convert to 25 fps
#
# MuseTalk works at 25 frames per second, so you convert your video once here; a photo becomes a one-frame clip.

# %%
converted = nbh.workbook.keep_video(video)
converted

# %% [markdown]
# Keep a copy of your audio beside it, so that your next notebooks find both.

# %%
kept_audio = nbh.workbook.keep_audio(audio)
kept_audio

# %% [markdown]
# ## Preview with `ui`
#
# Watch your converted video before you spend GPU time on it.

# %%
nbh.ui.show_video(converted.path)

# %% [markdown]
# Listen to your audio as well.

# %%
nbh.ui.show_audio(kept_audio)

# %% [markdown]
# ## Check
#
# The last cell checks that your converted file was written now and lasts as long as your video.

# %%
nbh.workbook.check(converted, duration_s=nbh.media.probe(video).duration_s)
