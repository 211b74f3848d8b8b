# %% [markdown]
# # Quickstart: lip-sync in a few cells
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/musetalk-workbook/musetalk-workbook/blob/main/notebooks/quickstart.ipynb)
#
# You run the whole workbook in six short cells: set up, choose your files, load the pipeline, lip-sync, and check. Each step has its own notebook, from 00_setup to 05_realtime, when you want to see more.
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
# ## Choose your files
#
# Put the paths of your video (or photo) and speech here, or leave them empty for the samples. Papermill and the tests replace this cell (it is tagged `parameters`).

# %% tags=["parameters"]
VIDEO = ""  # your video or photo, e.g. "/content/drive/MyDrive/face.mp4"; empty: the sample
AUDIO = ""  # your speech; empty: the sample

# %% [markdown]
# ## Load the `pipeline`
#
# You take your files (or the samples) and load the pipeline over your weights, downloading the ones you are missing; the planner chooses the device and precision for your runtime.

# %% tags=["nbval-ignore-output"]
video, audio = nbh.env.workbook_inputs(MODE, VIDEO, AUDIO)
pipe = nbh.MuseTalkPipeline.from_pretrained(nbh.workbook.weights(), config=nbh.workbook.plan("lipsync").config)
pipe

# %% [markdown]
# ## Lip-sync
#
# This runs every stage and plays your result here.

# %% tags=["nbval-ignore-output"]
result = pipe.lipsync(video, audio, nbh.workbook.path("quickstart.mp4"))
result

# %% [markdown]
# ## Check
#
# The last cell checks that your video was written now with one frame per 1/25 s of your audio.

# %%
nbh.workbook.check(result, audio=audio)
