# %% [markdown]
# # Set up your runtime
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/musetalk-workbook/musetalk-workbook/blob/main/notebooks/00_setup.ipynb)
#
# This notebook checks that your runtime can run MuseTalk: a GPU, the few packages Colab lacks, a landmark backend and, if you want them, the exact official landmarks and Google Drive. Run it once per Colab session; the other notebooks also set up what they need by themselves.

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
MOUNT_DRIVE = False  # True mounts Google Drive (Colab asks for your permission)
DRIVE_WEIGHTS = ""  # a Drive folder holding the weights, e.g. "/content/drive/MyDrive/musetalk-weights"
MMPOSE = False  # True installs mmcv, mmengine and mmpose for the exact official landmarks (slow)

# %% [markdown]
# ## Check the GPU (`gpu`)
#
# MuseTalk needs a CUDA GPU, so this cell stops a CPU-only runtime before you download anything. If it stops, choose *Runtime > Change runtime type > T4 GPU* and run your notebook again.

# %%
nbh.gpu.check_gpu(allow_cpu=True if MODE == "ci" else None)  # None: NBHELPERS_ALLOW_CPU decides

# %% [markdown]
# The planner reads your GPU's free memory and chooses the precision and the batch size for you; every later notebook asks it again.

# %% tags=["nbval-ignore-output"]
nbh.workbook.plan("lipsync")

# %% [markdown]
# ## Install what is missing (`env`)
#
# Colab already has torch, numpy and transformers, so the first cell installed only the light packages it lacks (the package's `[colab]` extra), at their minimum versions, and upgraded nothing protected. This table checks each one again and installs any still missing; outside Colab you only see what is missing.

# %% tags=["nbval-ignore-output"]
nbh.workbook.install_missing(dry_run=MODE != "colab")  # the [colab] extra: what Colab lacks

# %% [markdown]
# If your table ends with a red restart line, choose *Runtime > Restart session* and run your notebook again from the top.

# %% [markdown]
# ## Choose the landmark backend (`faces`)
#
# Landmarks place the crop box on your face. With `auto` you get mmpose when it is installed, else DWPose in torch (`dwpose`: the official weights, on your GPU in half precision, nothing extra to install), else DWPose in ONNX when onnxruntime and its file are there, else dlib; CI mode uses dlib, which needs no download. The line below says which one runs and why.

# %%
backend = nbh.faces.get_backend("dlib" if MODE == "ci" else "auto")
print(backend.name, "-", backend.reason)

# %% [markdown]
# ## Optional: the exact official landmarks (`faces.mim`)
#
# The official pipeline finds landmarks with mmpose, which needs mmcv, and prebuilt mmcv wheels exist only for some torch and CUDA versions. This check tells you whether your runtime has them, and how long an install would take.

# %% tags=["nbval-ignore-output"]
from nbhelpers.faces import mim
mim.check_mmcv_wheels()

# %% [markdown]
# Set `MMPOSE = True` in your parameters to install them: the install then verifies mmpose with one landmark pass in a fresh interpreter and reports how long it took. Otherwise you see the plan only, and the default `dwpose` backend (DWPose in torch) gives you the same landmarks without mmcv.

# %% tags=["nbval-ignore-output"]
from nbhelpers.faces import mim
mim.install_mmpose(dry_run=not MMPOSE or MODE == "ci")

# %% [markdown]
# ## Optional: Google Drive
#
# Mount Drive to keep your weights and results between sessions. In a workshop your teacher shares one weights folder: add a shortcut to it in *My Drive*, put its path in `DRIVE_WEIGHTS`, and you never download the weights yourself.

# %%
nbh.workbook.mount_drive(DRIVE_WEIGHTS, enabled=MOUNT_DRIVE)

# %% [markdown]
# ## Check
#
# The last cell checks that your runtime is ready: every requirement is satisfied now, torch imports, ffmpeg runs and a landmark backend is found. It needs no earlier cell to have worked, and if something is missing, it says how to fix it.

# %%
nbh.workbook.check_setup(backend="dlib" if MODE == "ci" else "auto")  # reads everything again itself
