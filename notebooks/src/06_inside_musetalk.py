# %% [markdown]
# # Inside MuseTalk
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/musetalk-workbook/musetalk-workbook/blob/main/notebooks/06_inside_musetalk.ipynb)
#
# You follow one frame of your video and one second of your speech through every stage of MuseTalk v1.5, in the official order: find the face, crop it, hide the mouth, encode, listen, generate, decode, parse and blend back. Each cell calls one step of `nbhelpers.reference`, a plain loop of about 100 lines written to be read, and shows its array. Then the engine runs the same second, and you check that it gives the same frames, faster. Plan about 45 minutes on a T4.
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
FRAME = 5  # the output frame you follow through every stage (frame 5 is 200-240 ms into the speech)

# %% [markdown]
# ## Inputs and `weights`
#
# You take your video and audio from 02_media (or the samples) and your weights, downloading what is missing.

# %%
video, audio = nbh.env.workbook_inputs(MODE, VIDEO, AUDIO)
WEIGHTS = nbh.workbook.weights()
video, audio

# %% [markdown]
# ## Load the `pipeline`
#
# The planner picks the device, precision and batch size for your GPU. The reference loop below uses the very models the pipeline holds, so any difference you find later comes from the code, not the weights.

# %% tags=["nbval-ignore-output"]
config = nbh.workbook.plan("lipsync").config
pipe = nbh.MuseTalkPipeline.from_pretrained(WEIGHTS, config=config)
pipe

# %% [markdown]
# ## One second of speech, and the frames it needs (`media`)
#
# You cut the first second of your speech: at 25 frames a second it makes 25 output frames. When the speech is longer than the video, MuseTalk plays the video forward, then backward, then forward again (so no jump shows), which is why output frame `FRAME` repaints source frame `J` and not always the frame of the same number.

# %%
speech, SPEECH = nbh.ui.cut_speech(audio, 1.0, nbh.workbook.path("inside", "one-second.wav"))
frames = nbh.ui.first_frames(video, len(speech) * 25 // 16000)
J = nbh.reference.source_index(FRAME, len(frames))

# %% [markdown]
# ## 1. Find the face (`faces`)
#
# The landmark backend finds your face (blue box) and its 68 landmarks (yellow), and the crop box (green) is built from them. Look at where its middle falls: the box reaches as far above the nose bridge (red) as the chin is below it, so its lower half holds the mouth and the jaw.

# %%
detector = pipe.landmarks(config.landmark_backend)
box, found = nbh.reference.find_face(frames[J], detector, config)
nbh.ui.show_face(frames[J], found, box)

# %% [markdown]
# Move your sliders: `bbox_shift` moves the nose-bridge point up or down (so the box grows or shrinks at the top) and `extra_margin` adds pixels under the chin. Watch how much of the chin and neck the green box takes in, since that is what MuseTalk may repaint.

# %% tags=["nbval-ignore-output"]
nbh.ui.crop_box_explorer(frames[J], found, config)

# %% [markdown]
# ## 2. Crop and mask (`latents`)
#
# Your box is resized to the 256 x 256 crop the networks were trained on, whatever the size of your face (left image). Look at the right image, a copy with its lower half black: in this copy the network cannot see your mouth, so it has to draw it from the sound. The heading names the module each step's code lives in.

# %%
crop = nbh.reference.crop_face(frames[J], box)
nbh.ui.show_crop(crop)

# %% [markdown]
# ## 3. Encode (`latents`, `models`)
#
# The VAE turns both of your images into 4 channels of 32 x 32 each, 8 channels together, one small grey image a channel: top row the masked copy (its lower half flat with real weights; noise in CI mode), bottom row the unmasked crop, the reference that tells the network who you are (skin, teeth, lighting). Its mouth is not copied, because in training the reference was another frame of the same video with the same head pose but a different mouth (paper, section 3). So the network learned to take the mouth from the sound.

# %%
latent = nbh.reference.encode(crop, pipe.models.vae, config, J)
nbh.ui.show_latents(latent)

# %% [markdown]
# ## 4. Listen (`audio`)
#
# Whisper's encoder hears your second of speech as 50 feature vectors a second. The heat map has time across (encoder frames) and feature channels down. Look at the cyan frame: these 10 encoder frames (200 ms, from 80 ms before your frame to 120 ms after its start) are all the sound your output frame is made from.

# %%
states = nbh.reference.whisper_states(speech, pipe.models)
nbh.ui.show_whisper(states, FRAME)

# %% [markdown]
# The window's 10 frames of 5 whisper layers become 50 tokens of 384 numbers each, the UNet's cross-attention input; you see their shape.

# %%
tokens = nbh.reference.audio_window(states, FRAME)
tuple(tokens.shape)

# %% [markdown]
# ## 5. Generate (`models`)
#
# The UNet runs once on your latents, at timestep 0 (a diffusion model's last, noise-free step): one step of inpainting, no noise and no sampling loop. Rows, top to bottom: the masked copy, the reference, the output. The output keeps the whole face's layout and fills in the masked half.

# %% tags=["nbval-ignore-output"]
generated = nbh.reference.generate(latent, tokens, pipe.models)
nbh.ui.show_latents(latent, generated)

# %% [markdown]
# ## 6. Decode (`latents`)
#
# The VAE decoder turns the 4 output channels back into a 256 x 256 face. Compare the mouth with your crop (in CI mode the weights are random, so you see colour noise).

# %%
face = nbh.reference.decode(generated, pipe.models.vae)
nbh.ui.show_images([crop, face], ["your crop", "decoded face"])

# %% [markdown]
# ## 7. Parse the face (`parsing`)
#
# BiSeNet labels every pixel of a square around the crop box, a little larger than it (skin, lips, nose, neck, hair...), and each `parsing_mode` keeps some labels, below the middle of the crop box, feathered at the edge. The mask is drawn over that square of your frame. Look at the white area: only those pixels of your frame change.

# %%
labels = nbh.reference.parse_face(frames[J], box, pipe.face_parser)
nbh.ui.show_parsing(labels, box, config)

# %% [markdown]
# ## 8. Blend back (`blending`)
#
# The face is resized to the crop box and mixed into your frame through the mask. Look at the difference image: it should be dark everywhere but the mouth and the jaw.

# %%
mask = nbh.reference.blend_mask(labels, box, config)
pasted = nbh.reference.paste_back(frames[J], face, box, mask)
nbh.ui.show_paste(frames[J], pasted, box)

# %% [markdown]
# ## The whole second (`reference`)
#
# `nbh.reference.lipsync` chains the eight steps for every output frame, one at a time, timing each stage. The chart shows the milliseconds each stage costs per frame on your runtime: what is large here is what an avatar computes once and keeps (faces, latents, parsing).

# %% tags=["nbval-ignore-output"]
timings = {}
looped = list(nbh.reference.lipsync(frames, speech, pipe.models, pipe.face_parser, config, detector=detector, timings=timings))
nbh.ui.plot_stage_ms(timings, len(looped))

# %% [markdown]
# ## The same second through the `engine`
#
# The pipeline's offline job runs the same second with batches, overlapping stages and a video writer. You collect its frames as they come and compare them with the loop's: they agree within 1 grey level, and the line says how much faster the engine is.

# %% tags=["nbval-ignore-output"]
engine = {}
result = pipe.lipsync(video, SPEECH, nbh.workbook.path("inside", "engine.mp4"), config=config, frame_callback=lambda t, f: engine.__setitem__(t, f.copy()))
comparison = nbh.ui.compare_frames(looped, engine, sum(timings.values()), result.wall_s)

# %% [markdown]
# You see the comparison: frames, the largest difference in grey levels, and milliseconds per frame of each.

# %%
comparison

# %% [markdown]
# ## Exercises
#
# Predict what changes before you run each one, then run the cells from the stage it touches.
#
# 1. Set `config = config.replace(parsing_mode="raw")` and rerun from *7. Parse the face*: which pixels of the difference image change, and why might the jaw line show a seam?
# 2. Set `config = config.replace(extra_margin=40)` and rerun from *1. Find the face*: where does the crop box grow, and what happens to the chin in the pasted frame?
# 3. Make the speech silent with `speech = speech * 0` and rerun from *4. Listen*: what does the mouth do when the window hears nothing?
# 4. Point `VIDEO` at another face (a photo works) and run everything again: which stages change their arrays, and which only their numbers?

# %% [markdown]
# ## Check
#
# The last cell checks that your engine run wrote a video as long as your second of speech.

# %%
nbh.workbook.check(result, audio=SPEECH)
