# %% [markdown]
# # Download and verify the weights
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/musetalk-workbook/musetalk-workbook/blob/main/notebooks/01_weights.ipynb)
#
# You download the official MuseTalk weights (about 4.2 GB) once and check every file. In CI mode you get a tiny random-weights tree in the same layout instead, because the model hub is out of reach there.

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
SETS = None  # weight sets to download; None = what MuseTalk 1.5 needs, "all" adds v1.0 and mmpose

# %% [markdown]
# ## Where your `weights` go
#
# Your weights folder comes from `NBHELPERS_WEIGHTS` (a Drive folder in a workshop), else a Drive or cache folder; CI mode makes a tiny tree.

# %%
WEIGHTS = nbh.workbook.weights(download=False)
WEIGHTS

# %% [markdown]
# ## What you download
#
# This table lists each file you need, its size and where it comes from.

# %%
nbh.weights.list_files(SETS or "default")

# %% [markdown]
# ## Download
#
# You download only what is missing: files already present are checked and kept, and a broken file is fetched again. The tiny CI tree is complete already, so nothing is fetched there.

# %% tags=["nbval-ignore-output"]
nbh.weights.download(WEIGHTS, sets=SETS)

# %% [markdown]
# ## Verify
#
# Verifying opens every file you have and checks its size and contents against the manifest.

# %%
report = nbh.weights.verify(WEIGHTS)
report

# %% [markdown]
# ## Check
#
# The last cell checks that your verification table has rows and no problem.

# %%
report.raise_for_problems()
nbh.workbook.check(report)
