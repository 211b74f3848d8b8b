#!/usr/bin/env python3
"""Split the modules of ``nbhelpers`` that mix concerns into packages whose folders show the architecture (issue 13).

Re-runnable on any checkout that still has the flat files: ``nbhelpers/gpu.py``, ``weights.py``, ``env.py`` and
``media.py`` each become a package (``nbhelpers/gpu/{__init__,allocator,device,...}.py``). The split is computed
from the code, not written by hand, so the other branches that change these files can land first and the split is
made again on the result:

    python tools/split_modules.py            # split every flat module still present, git rm the old files
    python tools/split_modules.py --dry-run  # print where every top-level statement goes and the line counts
    python tools/split_modules.py --check    # verify the packages (also tests/test_module_layout.py)

How a module is cut (standard library only; ``ast`` for the analysis, the source text itself is copied):

* Every top-level statement (def, class, assignment, expression) goes to the submodule that :data:`SPLITS` names
  for what it defines. A name missing from the table goes to the module's default submodule with a warning, so
  that a new name is placed by a person. An expression statement (the attribute docstring after a constant, the
  allocator call of ``gpu``) stays with the statement before it; ``__all__`` goes to ``__init__``; an
  ``if __name__ == "__main__":`` block becomes the package's ``__main__.py``.
* Each submodule keeps the original module's imports that it uses (relative ones one level up), and imports what
  it uses from its siblings. Submodules are layered in the table's order: a submodule imports at module level only
  from earlier ones (a name read at import time from a later one is an error: fix the table), and a function that
  calls into a later submodule imports that name inside the function (at call time, when every submodule has
  loaded), so there is no import cycle.
* ``__init__`` re-exports every name of the old module's namespace, private ones and its imports included, keeps
  the old ``__all__``, and makes the package one namespace with its submodules (:mod:`nbhelpers._namespace`):
  ``monkeypatch.setattr(gpu, "_name", value)`` reaches every submodule that holds ``_name``, so code that looks a
  name up at call time sees the patch as it did in the flat module, and tests written against the flat modules
  keep working unchanged.
* ``tests/test_module_layout.py`` is written with the old namespaces, and the old files are removed with ``git rm``.

If ruff is found (beside this Python, in the checkout's ``.venv`` or on PATH) the generated files get
``ruff check --fix --select I`` (import order only; the tool already writes them in that order, so it is a no-op
unless a new kind of import appears).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "nbhelpers"
MAX_LINES = 700
MARKER = "Made by tools/split_modules.py"
LAYOUT_TEST = "tests/test_module_layout.py"
NAMESPACE_MODULE = "_namespace"


# =====================================================================================================================
# The mapping: module -> ordered submodules (layers), each with its docstring and the names it owns.
# =====================================================================================================================


@dataclasses.dataclass(frozen=True)
class Sub:
    name: str
    doc: str
    names: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Split:
    module: str
    subs: tuple[Sub, ...]
    default: str  # where a name missing from the table goes (with a warning)

    def sub_of(self) -> dict[str, str]:
        table: dict[str, str] = {}
        for sub in self.subs:
            for name in sub.names:
                if name in table:
                    raise SystemExit(f"split table: {self.module}.{name} is listed in {table[name]} and {sub.name}")
                table[name] = sub.name
        return table


def _names(text: str) -> tuple[str, ...]:
    return tuple(text.split())


GPU = Split("gpu", default="planner", subs=(
    Sub("allocator", """The CUDA allocator setting made when :mod:`nbhelpers.gpu` is imported.

    Owns :func:`prefer_expandable_segments` and its import-time call: ``PYTORCH_CUDA_ALLOC_CONF`` is set to
    expandable segments before torch starts CUDA, unless the user configured the allocator.
    """, _names("ALLOCATOR_SETTING prefer_expandable_segments")),
    Sub("model", """The memory and time model: every constant the planner uses, with its source.

    Owns :class:`MemoryModel` (peak GPU memory per stage as ``fixed + per_frame * batch``),
    :class:`CpuTimes` / :data:`CPU_TIMES` and :func:`cpu_seconds` (how long a CPU job takes), and
    :func:`stage_memory` (the model evaluated for one stage and batch).
    """, _names("""
        T GIB MemoryModel MEMORY_MODEL CpuTimes CPU_TIMES cpu_seconds DEFAULT_FRAME_SIZE KINDS WEIGHTS stage_memory
    """)),
    Sub("device", """The device report: what this runtime has (GPU, memory, driver, versions, host RAM) and the checks on it.

    Owns :class:`GpuReport` / :func:`report` (torch, NVML and ``nvidia-smi``, each optional), :func:`check_gpu`
    and :func:`check_device`, and the small environment probes the planner shares (:func:`_in_colab`,
    :func:`_env_flag`). Nothing here imports torch at module import.
    """, _names("""
        NVIDIA_SMI_TIMEOUT_S COLAB_GPU_STEPS NoGpuError GpuProcess GpuReport report _read_report _no_cuda_message
        check_device check_gpu _device_index _read_torch_cuda _driver_info _same_uuid _nvml_info _run_nvidia_smi
        _number _nvidia_smi_info _host_ram_gib _in_colab _env_flag
    """)),
    Sub("planner", """The planner: device, precision and batch size for a job, with the reason for each.

    Owns :class:`Plan`, :func:`plan` (the device report and the memory model turned into a decision),
    :func:`snap_batch` and the budget and batch helpers, and :class:`PlanWarning`.
    """, _names("""
        PlanWarning Plan snap_batch plan _gpu_budget _fit_batch _cpu_batch _duration
    """)),
    Sub("memory", """Peak-memory discipline: releasing models and caches, and measuring what each stage held.

    Owns :func:`release` / :func:`empty_cache` (drop references and return cached blocks),
    :func:`memory_scope` / :class:`StageMemory` and :func:`peak_memory` / :class:`PeakMemory` /
    :func:`reset_peak` (peak reserved memory per stage), and :func:`cast_and_move`.
    """, _names("""
        _PEAK_SEEN _cuda empty_cache _empty_cache release _release_one StageMemory memory_scope _remember_peak
        PeakMemory peak_memory reset_peak cast_and_move
    """)),
    Sub("oom", """Recovery from out-of-memory: stages run in ordered batches that halve on OOM without losing a frame.

    Owns :func:`is_oom` (which errors are out-of-memory) and :func:`batched` (the halving, resuming batch loop
    that the render engine, latents, parsing and face detection run through).
    """, _names("is_oom batched _batched")),
))


WEIGHTS = Split("weights", default="manifest", subs=(
    Sub("manifest", """The manifest of the weight files: what a job needs, where each file comes from, and the folders.

    Owns :class:`WeightFile` / :class:`Source` / :class:`Fact` and the entries of :data:`MANIFEST` (sets,
    aliases), :func:`required_files` / :func:`missing_files`, the file table (:func:`list_files`), the choice of
    the weights folder (:func:`default_dir`, :func:`drive_dir`, :data:`ENV_VAR`, :data:`DRIVE_DIR`) and the
    tiny-weights marker (:func:`is_tiny`).
    """, _names("""
        ENV_VAR DRIVE_DIR STATE_FILE STAGING_DIR TINY_MARKER HF_MIRROR DOWNLOAD_COMMAND NOTEBOOK
        ATTEMPTS_PER_SOURCE RETRY_DELAY_S HTTP_TIMEOUT_S _CHUNK _GB Fact Source WeightFile _hub _MUSETALK _VAE
        _WHISPER _DWPOSE _ENTRIES SETS DEFAULT_SETS _ALIASES Manifest MANIFEST required_files missing_files _human
        _text_table _html_table FileTable list_files _on_colab _holds_weights drive_dir default_dir is_tiny
    """)),
    Sub("inspect", """File inspection: what a file on disk really is, read without trusting or unpickling it.

    Owns the states (:data:`OK`, :data:`HTML_PAGE`, :data:`LFS_POINTER`, :data:`TRUNCATED`, ...),
    :class:`Inspection` and :func:`inspect_file`: sniffing of HTML error pages and Git LFS pointers, and
    structural checks of torch zip and legacy checkpoints (a skimming unpickler that builds nothing),
    safetensors, JSON and ONNX files.
    """, _names("""
        OK MISSING WRONG_SIZE HTML_PAGE LFS_POINTER TRUNCATED HASH_MISMATCH CORRUPT UNVERIFIABLE BAD_STATES
        Inspection _FORMAT_BY_SUFFIX _LFS_PREFIX _looks_html inspect_file _inspect_torch _Stub _ELEMENT_BYTES
        _SkimUnpickler _inspect_legacy_torch _inspect_safetensors _inspect_json _varint _inspect_onnx
    """)),
    Sub("verification", """Verification: the weights folder checked against the manifest, with a fix for every bad file.

    Owns the recorded state (:class:`_State`: hub facts and cached hashes), :func:`sha256_file`, the expected
    facts of a file (:class:`Expected`), :class:`FileCheck` / :class:`VerifyReport` and :func:`verify`, and
    the files of one job (:func:`job_files`, :func:`check_job_files`).
    """, _names("""
        _State sha256_file Expected expected_facts _expected FileCheck _STATE_COLOURS VerifyReport _set_arg _fix
        _same_dir _check verify _LANDMARK_SETS _AUTO_ORDER _auto_landmark_sets job_files check_job_files
    """)),
    Sub("downloads", """Downloads that survive real networks: three transports, retries, staging and acceptance.

    Owns :func:`download` and :class:`DownloadReport` / :class:`DownloadRow`, the transports (the Hugging Face
    hub through ``huggingface_hub``, Google Drive, plain HTTP(S); files bundled in the package), the host checks
    and offline mode, staging of partial files, and the check that accepts a file only once verified.
    """, _names("""
        DownloadRow DownloadReport _Rejected _Skipped _Unreachable _HOSTS _check_host _offline _default_endpoint
        _permanent _short _staging _fetch_hub _fetch_gdrive _fetch_url _fetch_plain _fetch_bundled _fetch _accept
        _download_one _discard_staged _failure_message download
    """)),
    Sub("cli", """The command line of the weights: ``python -m nbhelpers.weights list|download|verify``.

    Owns :func:`main` (argument parsing, printing the reports, exit codes).
    """, _names("main")),
))


ENV = Split("env", default="modes", subs=(
    Sub("modes", """Run modes and the session: where the notebooks run and what mode they run in.

    Owns :data:`MODES` / :func:`run_mode` (``NBHELPERS_MODE``: ``full`` or ``ci``), :func:`in_colab`, the
    shared constants of the workbook's media (paths, licences, clip length), the packages the environment
    report names, :class:`ResultCheckError`, and the attribute readers the report and the checks share.
    """, _names("""
        MODES CI_CLIP_SECONDS SHARED_VIDEO SHARED_AUDIO SHARED_AUDIO_2 MEDIA_LICENCES AUDIO_SUFFIXES WORKBOOK_VIDEO
        WORKBOOK_AUDIO DRIVE_MOUNTPOINT PROTECTED NEVER_INSTALL ALTERNATIVES _DISTS REPORTED _SESSION_START
        ResultCheckError in_colab run_mode _check_mode _first_attr _first_number
    """)),
    Sub("install", """The installer: what is installed, what is missing, and installing it without touching torch.

    Owns :func:`package_version`, :func:`restart_reasons` (a package upgraded under a running kernel), the
    requirements of the Colab extra (:func:`read_requirements`, :func:`colab_requirements`, the checkout's
    pyproject), :class:`InstallReport` / :class:`InstallRow` and :func:`install_missing`.
    """, _names("""
        package_version restart_reasons _same_version _normalise read_requirements DIST_NAME COLAB_EXTRA
        colab_requirements _checkout_extra InstallRow InstallReport install_missing RESTART_MESSAGE
    """)),
    Sub("drive", """Google Drive on Colab: mounting it and saying whether it is mounted.

    Owns :func:`drive_mounted`, :func:`mount_drive` and :class:`DriveStatus`.
    """, _names("drive_mounted mount_drive DriveStatus")),
    Sub("folders", """The workbook's folders and inputs: work, media and weights folders, and the clips a notebook uses.

    Owns :func:`work_dir`, :func:`media_dir`, :func:`weights_dir`, :func:`shared_data_dir`, the CI media
    cutting (:func:`_cut`, short clips of the shared media in ``ci`` mode, cached by source fingerprint),
    :func:`workbook_inputs`, :func:`keep_audio`, :func:`sample_audios`, :func:`upload`, and the mode's
    defaults (:func:`default_config`, :func:`plan`).
    """, _names("""
        _source_fingerprint work_dir media_dir _weights_path weights_dir shared_data_dir _ffmpeg _cut
        workbook_inputs _default_inputs keep_audio _demo sample_audios default_config plan upload media_seconds
    """)),
    Sub("session", """The setup report of a notebook: versions, device, restart advice, in one object that shows itself.

    Owns :class:`EnvReport` and :func:`setup` (what the first cell of every notebook calls) with the device
    summary it shows.
    """, _names("EnvReport setup _device_summary")),
    Sub("checks", """Assertions the notebooks make on themselves: a result is real, the setup works.

    Owns :func:`check_result` (an output file exists, plays, has the frames and audio it should) and
    :func:`check_setup` (imports, ffmpeg, the landmark backend and the weights a notebook needs).
    """, _names("check_result ONNX_ONLY check_setup _check_file")),
))


MEDIA = Split("media", default="ffmpeg", subs=(
    Sub("ffmpeg", """The ffmpeg binary and its processes: finding it, its version, and running it over pipes safely.

    Owns :func:`ffmpeg_exe` / :func:`ffmpeg_version` (the bundled imageio-ffmpeg binary, else the system one),
    :class:`_Process` (a child with bounded waits and a stderr tail) and the path checks shared by the readers
    and the writer, and :data:`SYNTHETIC_TAG`.
    """, _names("""
        SYNTHETIC_TAG _STDERR_TAIL_LINES WRITER_STALL_TIMEOUT_S _KILL_WAIT_S _PIPE_CHUNK _IMAGE_CODECS
        _ALPHA_PIX_FMTS _WRITER_SUFFIXES _PCM_FORMATS _CHANNEL_LAYOUTS _bundled_ffmpeg ffmpeg_exe ffmpeg_version
        _parse_version _passthrough _Process _run _tail _existing_file
    """)),
    Sub("probing", """Probing: what a media file holds (streams, fps, duration, rotation), parsed from ffmpeg's own output.

    Owns :class:`MediaInfo` / :class:`StreamInfo` and :func:`probe`, with the parsers of ffmpeg's stream
    lines (rates, channel layouts, rotation side data).
    """, _names("""
        StreamInfo MediaInfo _fps_text _split_top _parse_rate _channel_count _rotation_cw _STREAM_RE _DURATION_RE
        _MATRIX_RE _ROTATE_TAG_RE _parse_ffmpeg_info _parse_stream _EXIF_ROTATION _exif_orientation _replace
        _count_packets probe
    """)),
    Sub("video", """Reading video: frames at a constant 25 fps, photos as one frame, upright and without alpha.

    Owns :class:`VideoReader` (streaming, resampled to 25 fps, EXIF and rotation applied), :func:`load_video`,
    :func:`frames_at`, :func:`read_frame` and :func:`convert_to_25fps`.
    """, _names("""
        _apply_orientation _progress_frames _has_alpha _flatten_alpha _check_fps _check_background _FrameStream
        VideoReader load_video frames_at read_frame
    """)),
    Sub("audio", """Decoding audio: any file to 16 kHz mono float32, natively where possible, else through ffmpeg.

    Owns :func:`load_audio` and :func:`audio_duration` with the soundfile and ffmpeg decoders.
    """, _names("_soundfile_read _wav_header _ffmpeg_decode _decode_native load_audio audio_duration")),
    Sub("writer", """Writing video: the encoder choice and the writer that pipes frames and audio into an MP4.

    Owns :data:`ENCODER_SETTINGS`, :class:`EncoderChoice` / :func:`choose_encoder` / :func:`nvenc_probe`
    (NVENC probed once per process, libx264 fallback), :class:`VideoWriter` (temporary name, rename on
    success, bounded waits on a stalled ffmpeg), :func:`convert_to_25fps` (a file re-encoded at 25 fps) and
    :func:`demo_inputs` (the packaged demo photo and speech, written out).
    """, _names("""
        ENCODER_SETTINGS _PROBE_SIZE _probe_cache _probe_lock EncoderChoice nvenc_probe choose_encoder VideoWriter
        _Stalled convert_to_25fps demo_inputs
    """)),
))

SPLITS = (GPU, WEIGHTS, ENV, MEDIA)


# =====================================================================================================================
# Scopes: which names a statement reads from the module's globals, and when.
# =====================================================================================================================

_SCOPE_NODES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp,
                ast.DictComp, ast.GeneratorExp)
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def _parts(node: ast.AST) -> tuple[list[ast.AST], list[ast.AST], list[ast.AST]]:
    """(evaluated in the enclosing scope, annotations (enclosing scope, never evaluated), the scope's interior)."""
    if isinstance(node, _FUNCTIONS + (ast.Lambda,)):
        a = node.args
        outer = [d for d in a.defaults] + [d for d in a.kw_defaults if d is not None]
        notes: list[ast.AST] = []
        if isinstance(node, _FUNCTIONS):
            outer = list(node.decorator_list) + outer
            args = a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]
            notes = [x.annotation for x in args if x.annotation is not None]
            if node.returns is not None:
                notes.append(node.returns)
        inner = list(node.body) if isinstance(node.body, list) else [node.body]
        return outer, notes, inner
    if isinstance(node, ast.ClassDef):
        return list(node.decorator_list) + list(node.bases) + list(node.keywords), [], list(node.body)
    if isinstance(node, _COMPREHENSIONS):
        first, *rest = node.generators
        inner: list[ast.AST] = [first.target, *first.ifs]
        for gen in rest:
            inner += [gen.target, gen.iter, *gen.ifs]
        inner += [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        return [first.iter], [], inner
    raise TypeError(node)


def _own_nodes(nodes: list[ast.AST]):
    """Every node in ``nodes`` that belongs to their scope (nested scopes yield themselves, then their outer parts)."""
    stack = list(reversed(nodes))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, _SCOPE_NODES):
            outer, notes, _ = _parts(node)
            stack.extend(reversed(outer + notes))
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _bound(node: ast.AST | None, nodes: list[ast.AST]) -> tuple[set[str], set[str]]:
    """(names bound in the scope of ``node`` whose interior is ``nodes``, names it declares global)."""
    bound: set[str] = set()
    declared: set[str] = set()
    if isinstance(node, _FUNCTIONS + (ast.Lambda,)):
        a = node.args
        bound |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]}
    for sub in _own_nodes(nodes):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, (ast.Store, ast.Del)):
            bound.add(sub.id)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and sub is not node:
            bound.add(sub.name)
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
            for alias in sub.names:
                bound.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(sub, ast.ExceptHandler) and sub.name:
            bound.add(sub.name)
        elif isinstance(sub, (ast.MatchAs, ast.MatchStar)) and sub.name:
            bound.add(sub.name)
        elif isinstance(sub, ast.MatchMapping) and sub.rest:
            bound.add(sub.rest)
        elif isinstance(sub, ast.Global):
            declared |= set(sub.names)
        elif isinstance(sub, ast.Nonlocal):
            bound -= set(sub.names)
    if not isinstance(node, _COMPREHENSIONS):
        # A walrus inside a comprehension binds in the enclosing function (PEP 572).
        for comp in (n for n in _own_nodes(nodes) if isinstance(n, _COMPREHENSIONS)):
            for sub in ast.walk(comp):
                if isinstance(sub, ast.NamedExpr) and isinstance(sub.target, ast.Name):
                    bound.add(sub.target.id)
    return bound - declared, declared


@dataclasses.dataclass
class Scope:
    node: ast.AST
    bound: set[str]
    declared_global: set[str]


@dataclasses.dataclass
class Refs:
    """The module-global names one top-level statement reads."""

    runtime: set[str] = dataclasses.field(default_factory=set)  # read while the module is imported
    annotations: set[str] = dataclasses.field(default_factory=set)  # only in annotations (never evaluated)
    deferred: dict[int, set[str]] = dataclasses.field(default_factory=dict)  # id(def) -> read at call time
    defs: dict[int, ast.AST] = dataclasses.field(default_factory=dict)  # id(def) -> the def
    rebinds: set[str] = dataclasses.field(default_factory=set)  # assigned through a `global` statement
    magic: list[ast.Name] = dataclasses.field(default_factory=list)  # __file__, __name__, globals, ...


_MAGIC = {"__file__", "__name__", "__package__", "__spec__", "__loader__", "__path__", "globals", "vars",
          "__builtins__"}


def statement_refs(stmt: ast.stmt, future_annotations: bool) -> Refs:
    refs = Refs()

    def visit(node: ast.AST, scopes: list[Scope], annotation: bool) -> None:
        if isinstance(node, _SCOPE_NODES):
            outer, notes, inner = _parts(node)
            for child in outer:
                visit(child, scopes, annotation)
            for child in notes:
                visit(child, scopes, True)
            bound, declared = _bound(node, inner)
            scope = Scope(node, bound, declared)
            for child in inner:
                visit(child, scopes + [scope], annotation)
            return
        if isinstance(node, ast.AnnAssign):
            visit(node.target, scopes, annotation)
            visit(node.annotation, scopes, True)
            if node.value is not None:
                visit(node.value, scopes, annotation)
            return
        if isinstance(node, ast.Name):
            classify(node, scopes, annotation)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, scopes, annotation)

    def classify(node: ast.Name, scopes: list[Scope], annotation: bool) -> None:
        name = node.id
        if name in _MAGIC:
            refs.magic.append(node)
        for depth, scope in enumerate(reversed(scopes)):
            if name in scope.declared_global:
                if isinstance(node.ctx, (ast.Store, ast.Del)):
                    refs.rebinds.add(name)
                break
            if isinstance(scope.node, ast.ClassDef) and depth > 0:
                continue  # a class body's names are not visible inside its methods
            if name in scope.bound:
                return  # a local, a parameter or a closure variable
        if not isinstance(node.ctx, ast.Load):
            if scopes:
                return
        functions = [s.node for s in scopes if isinstance(s.node, _FUNCTIONS + (ast.Lambda,))]
        if annotation and future_annotations:
            refs.annotations.add(name)
        elif not functions or not isinstance(functions[0], _FUNCTIONS):
            refs.runtime.add(name)  # module level, a class body, or a module-level lambda (no place for an import)
        else:
            refs.deferred.setdefault(id(functions[0]), set()).add(name)
            refs.defs[id(functions[0])] = functions[0]

    visit(stmt, [], False)
    return refs


def module_bindings(stmt: ast.stmt) -> set[str]:
    """Names a top-level statement binds in the module namespace."""
    bound, _ = _bound(None, [stmt])
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        bound = {stmt.name}
    return bound


# =====================================================================================================================
# Reading a flat module
# =====================================================================================================================


@dataclasses.dataclass
class Statement:
    node: ast.stmt
    index: int  # position among the module's top-level statements
    start: int  # its first line (a decorator's, for a decorated definition)
    lead: list[str]  # blank lines and comments before it, from the end of the previous statement
    text: list[str]  # its own lines (decorators included)
    defines: set[str]
    refs: Refs
    sub: str = ""
    kind: str = "code"  # code | import | all | main | docstring | future


@dataclasses.dataclass
class Module:
    split: Split
    path: Path
    source: str
    lines: list[str]
    tree: ast.Module
    docstring: str
    statements: list[Statement]
    imports: list[Statement]
    future_annotations: bool

    @property
    def defined(self) -> dict[str, Statement]:
        out: dict[str, Statement] = {}
        for st in self.statements:
            if st.kind == "code":
                for name in st.defines:
                    out.setdefault(name, st)
        return out

    @property
    def imported(self) -> set[str]:
        return {n for st in self.imports for n in st.defines}


def read_module(split: Split, path: Path) -> Module:
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(path))
    lines = source.splitlines(keepends=True)
    body = tree.body
    if not body or not (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                        and isinstance(body[0].value.value, str)):
        raise SystemExit(f"{path}: no module docstring")
    future = any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
                 and any(a.name == "annotations" for a in n.names) for n in body)
    statements: list[Statement] = []
    previous_end = 0
    for index, node in enumerate(body):
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        if index and start <= previous_end:
            raise SystemExit(f"{path}:{node.lineno}: two top-level statements on one line; put them on two lines")
        lead = lines[previous_end:start - 1]
        text = lines[start - 1:node.end_lineno]
        previous_end = node.end_lineno
        st = Statement(node, index, start, lead, text, module_bindings(node), statement_refs(node, future))
        if index == 0:
            st.kind = "docstring"
        elif isinstance(node, ast.ImportFrom) and node.module == "__future__":
            st.kind = "future"
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            st.kind = "import"
        elif isinstance(node, ast.Assign) and st.defines == {"__all__"}:
            st.kind = "all"
        elif (isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
              and ast.unparse(node.test).replace("'", '"') == '__name__ == "__main__"'):
            st.kind = "main"
        statements.append(st)
    if previous_end < len(lines):  # comments after the last statement stay with it
        statements[-1].text += lines[previous_end:]
    return Module(split, path, source, lines, tree, ast.get_docstring(tree) or "", statements,
                  [s for s in statements if s.kind == "import"], future)


# =====================================================================================================================
# Planning the split
# =====================================================================================================================


@dataclasses.dataclass
class Plan:
    module: Module
    order: list[str]  # submodule names, layers in import order
    assignment: dict[int, str]  # statement index -> submodule
    top_imports: dict[str, dict[str, set[str]]]  # submodule -> sibling -> names imported at module level
    typing_imports: dict[str, dict[str, set[str]]]  # submodule -> sibling -> names for annotations only
    lazy: dict[int, dict[str, set[str]]]  # id(def) -> sibling -> names imported inside the function
    defs: dict[int, ast.AST]
    warnings: list[str]


class SplitError(SystemExit):
    pass


def plan_split(module: Module) -> Plan:
    split = module.split
    table = split.sub_of()
    order = [s.name for s in split.subs]
    if split.default not in order:
        raise SplitError(f"{split.module}: default submodule {split.default!r} is not in the table")
    notes: list[str] = []
    namespace = set(module.defined) | module.imported
    reserved = {"__init__", "__main__", "_SUBMODULES"}
    for sub in order:
        if sub in namespace or sub in reserved or sub == NAMESPACE_MODULE:
            raise SplitError(f"{split.module}: submodule name {sub!r} is also a name of the module; the package "
                             f"attribute would be ambiguous. Rename the submodule in the table.")
    if NAMESPACE_MODULE in namespace or "_SUBMODULES" in namespace:
        raise SplitError(f"{split.module}: defines {NAMESPACE_MODULE!r} or _SUBMODULES, which __init__ uses")

    assignment: dict[int, str] = {}
    previous = ""
    for st in module.statements:
        if st.kind != "code":
            continue
        if isinstance(st.node, ast.Expr):
            if not previous:
                raise SplitError(f"{module.path}:{st.node.lineno}: an expression before any definition")
            assignment[st.index] = previous
            continue
        if not st.defines:
            raise SplitError(f"{module.path}:{st.node.lineno}: a top-level statement that defines nothing "
                             f"({type(st.node).__name__}); the table cannot place it")
        subs = {table.get(n) for n in st.defines}
        if None in subs:
            missing = sorted(n for n in st.defines if n not in table)
            notes.append(f"warning: {split.module}: {', '.join(missing)} (line {st.node.lineno}) not in the table; "
                         f"put in {split.default}.py. Add it to SPLITS in tools/split_modules.py.")
            subs.discard(None)
            subs.add(split.default)
        if len(subs) > 1:
            raise SplitError(f"{module.path}:{st.node.lineno}: one statement defines names mapped to "
                             f"{sorted(subs)}: {sorted(st.defines)}")
        previous = assignment[st.index] = subs.pop()
    for name in sorted(set(table) - set(module.defined)):
        notes.append(f"warning: {split.module}: {name} is in the table but no longer in {module.path.name}")

    # One definition site per name.
    where: dict[str, str] = {}
    for st in module.statements:
        if st.index in assignment:
            for name in st.defines:
                if where.setdefault(name, assignment[st.index]) != assignment[st.index]:
                    raise SplitError(f"{split.module}.{name} is bound in {where[name]} and in "
                                     f"{assignment[st.index]}; map all its statements to one submodule")
    layer = {name: i for i, name in enumerate(order)}
    top: dict[str, dict[str, set[str]]] = {s: {} for s in order}
    typing_: dict[str, dict[str, set[str]]] = {s: {} for s in order}
    lazy: dict[int, dict[str, set[str]]] = {}
    defs: dict[int, ast.AST] = {}
    for st in module.statements:
        if st.index not in assignment:
            continue
        here = assignment[st.index]
        refs = st.refs
        for name in sorted(refs.rebinds):
            users = {assignment[o.index] for o in module.statements if o.index in assignment
                     and (name in o.refs.runtime or name in o.refs.annotations
                          or any(name in v for v in o.refs.deferred.values()))}
            if where.get(name) != here or users - {here}:
                raise SplitError(f"{split.module}.{name} is rebound with `global` (line {st.node.lineno}) and used "
                                 f"in {sorted(users | {where.get(name, '?')})}; keep it and its users in one "
                                 f"submodule")
        for name in sorted(refs.runtime):
            there = where.get(name)
            if there is None or there == here:
                continue
            if layer[there] > layer[here]:
                raise SplitError(f"{split.module}: {here}.py reads {name} from {there}.py at import time (line "
                                 f"{st.node.lineno}), but {there} comes later in the table's order; move one of "
                                 f"them or reorder the submodules")
            top[here].setdefault(there, set()).add(name)
        for key, names in refs.deferred.items():
            for name in sorted(names):
                there = where.get(name)
                if there is None or there == here:
                    continue
                if layer[there] < layer[here]:
                    top[here].setdefault(there, set()).add(name)
                else:
                    lazy.setdefault(key, {}).setdefault(there, set()).add(name)
                    defs[key] = refs.defs[key]
        for name in sorted(refs.annotations):
            there = where.get(name)
            if there is None or there == here:
                continue
            if layer[there] < layer[here]:
                top[here].setdefault(there, set()).add(name)
            else:
                typing_[here].setdefault(there, set()).add(name)
    for here in order:  # a name imported at module level needs no TYPE_CHECKING import
        for there, names in typing_[here].items():
            names -= top[here].get(there, set())
        typing_[here] = {k: v for k, v in typing_[here].items() if v}
    return Plan(module, order, assignment, top, typing_, lazy, defs, notes)


# =====================================================================================================================
# Writing the package
# =====================================================================================================================


def _natural(text: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def member_key(name: str) -> tuple:
    """isort's (and ruff's) order of the names in one ``from x import``: CONSTANTS, Classes, functions."""
    cased = [c for c in name if c.isalpha()]
    if len(name) > 1 and cased and all(c.isupper() for c in cased):
        kind = 0
    elif name[:1].isupper():
        kind = 1
    else:
        kind = 2
    return kind, _natural(name.lower()), _natural(name)


def from_import(level: str, module: str, names: set[str], indent: str = "", width: int = 120) -> list[str]:
    items = sorted(names, key=member_key)
    one = f"{indent}from {level}{module} import {', '.join(items)}\n"
    if len(one.rstrip("\n")) <= width:
        return [one]
    return [f"{indent}from {level}{module} import (\n", *[f"{indent}    {n},\n" for n in items], f"{indent})\n"]


_FILE_PATTERNS = (
    (re.compile(r"Path\(__file__\)((?:\.resolve\(\))?)\.parents\[(\d+)\]"),
     lambda m: f"Path(__file__){m.group(1)}.parents[{int(m.group(2)) + 1}]"),
    (re.compile(r"Path\(__file__\)((?:\.resolve\(\))?)\.parent(?![\w\[])"),
     lambda m: f"Path(__file__){m.group(1)}.parents[1]"),
)


def _edit_lines(st: Statement, plan: Plan) -> list[str]:
    """The statement's lines with relative imports one level up, ``__file__`` paths one folder deeper, and the
    imports from later submodules inserted at the top of the functions that need them."""
    first = st.start
    lines = list(st.text)
    module = plan.module
    # 1. Relative imports inside the statement: one more dot.
    for node in ast.walk(st.node):
        if isinstance(node, ast.ImportFrom) and node.level:
            i = node.lineno - first
            raw = lines[i].encode()
            col = node.col_offset
            head = raw[col:]
            m = re.match(rb"from(\s+)(\.+)", head)
            if not m:
                raise SplitError(f"{module.path}:{node.lineno}: cannot find the dots of a relative import")
            raw = raw[:col] + b"from" + m.group(1) + m.group(2) + b"." + head[m.end():]
            lines[i] = raw.decode()
    # 2. __file__: the file is one folder deeper now.
    uses = [n for n in st.refs.magic if n.id == "__file__"]
    for node in st.refs.magic:
        if node.id != "__file__" and not (st.kind == "main" and node.id == "__name__"):
            raise SplitError(f"{module.path}:{node.lineno}: uses {node.id}, whose value changes when the module "
                             f"becomes a package; teach tools/split_modules.py how to rewrite it")
    done = 0
    for line_no in sorted({n.lineno for n in uses}):
        i = line_no - first
        for pattern, repl in _FILE_PATTERNS:
            lines[i], count = pattern.subn(repl, lines[i])
            done += count
    if done != len(uses):
        raise SplitError(f"{module.path}: {len(uses) - done} use(s) of __file__ not of the form "
                         f"Path(__file__)[.resolve()].parent / .parents[n] (lines "
                         f"{sorted({n.lineno for n in uses})}); teach tools/split_modules.py how to rewrite them")
    # 3. Imports from later submodules, inside the functions that call into them (bottom-up keeps line numbers).
    inserts: list[tuple[int, list[str]]] = []
    for node in ast.walk(st.node):
        if id(node) not in plan.lazy:
            continue
        body = node.body
        at = body[0]
        skip = isinstance(at, ast.Expr) and isinstance(at.value, ast.Constant) and isinstance(at.value.value, str)
        rest = body[1:] if skip else body
        while rest and isinstance(rest[0], (ast.Import, ast.ImportFrom)):
            at, rest = rest[0], rest[1:]
            skip = True
        if skip:
            line_after = at.end_lineno  # insert after the docstring / the function's own imports
            indent = " " * body[0].col_offset
        else:
            line_after = at.lineno - 1
            indent = " " * at.col_offset
        if at.lineno == node.lineno:
            raise SplitError(f"{module.path}:{node.lineno}: a one-line function needs a lazy import; split its line")
        new: list[str] = []
        for there in sorted(plan.lazy[id(node)]):
            new += from_import(".", there, plan.lazy[id(node)][there], indent)
        following = lines[line_after - first + 1] if line_after - first + 1 < len(lines) else ""
        if following.strip() and not following.lstrip().startswith(("import ", "from ")):
            new.append("\n")
        inserts.append((line_after - first + 1, new))
    for position, new in sorted(inserts, reverse=True):
        lines[position:position] = new
    return lines


def _strip_leading(lines: list[str]) -> list[str]:
    while lines and not lines[0].strip():
        lines = lines[1:]
    return lines


def _strip_blank(lines: list[str]) -> list[str]:
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def _chains(nodes: list[ast.AST]) -> tuple[set[str], set[str], set[str]]:
    """(names read, dotted attribute chains read such as ``importlib.util.find_spec``, dotted modules imported)."""
    names: set[str] = set()
    chains: set[str] = set()
    dotted: set[str] = set()
    for node in nodes:
        bases = {id(sub.value) for sub in ast.walk(node) if isinstance(sub, ast.Attribute)}
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                names.add(sub.id)
                if id(sub) not in bases:
                    chains.add(sub.id)
            elif isinstance(sub, ast.Attribute) and id(sub) not in bases:
                parts = []
                base: ast.AST = sub
                while isinstance(base, ast.Attribute):
                    parts.append(base.attr)
                    base = base.value
                if isinstance(base, ast.Name):
                    chains.add(".".join([base.id, *reversed(parts)]))
            elif isinstance(sub, ast.Import):
                dotted |= {a.name for a in sub.names if "." in a.name and not a.asname}
    return names, chains, dotted


def _keeps(alias: ast.alias, is_import: bool, used: tuple[set[str], set[str], set[str]] | None,
           dotted_here: set[str]) -> bool:
    """Whether a submodule needs one name of an original top-level import."""
    if used is None:
        return True
    names, chains, dotted = used
    if not is_import or alias.asname or "." not in alias.name:
        return (alias.asname or alias.name.split(".")[0]) in names
    # `import a.b` binds `a`: needed for a use of `a.b...`, or a use of `a` that no other `import a.x` provides.
    head = alias.name.split(".")[0]
    others = (dotted | dotted_here) - {alias.name}
    for chain in chains:
        if chain.split(".")[0] != head:
            continue
        if chain == alias.name or chain.startswith(alias.name + "."):
            return True
        if not any(chain == o or chain.startswith(o + ".") for o in others):
            return True
    return False


def _section(node: ast.stmt) -> int:
    """isort's sections: 0 future, 1 standard library, 2 third party, 3 first party, 4 local (relative)."""
    if isinstance(node, ast.ImportFrom):
        if node.level:
            return 4
        top = (node.module or "").split(".")[0]
    else:
        top = node.names[0].name.split(".")[0]
    if top == "__future__":
        return 0
    if top in sys.stdlib_module_names:
        return 1
    return 3 if top == PACKAGE else 2


def import_block(module: Module, used: tuple[set[str], set[str], set[str]] | None,
                 siblings: dict[str, set[str]], local_first: list[str] = ()) -> list[str]:
    """The original module's top-level imports that ``used`` needs (None: all), relative ones one level up, then
    ``local_first`` and the imports from sibling submodules; one blank line between isort's sections."""
    sections: dict[int, list[str]] = {}
    for st in module.imports:
        node = st.node
        section = _section(node)
        if section == 0:
            continue
        is_import = isinstance(node, ast.Import)
        aliases = [a for a in node.names if _keeps(a, is_import, used, set())]
        if not aliases:
            continue
        lines = sections.setdefault(section, [])
        if len(aliases) == len(node.names):
            lines += _strip_blank(_edit_lines(st, Plan(module, [], {}, {}, {}, {}, {}, [])))
        elif is_import:
            lines += [f"import {a.name}{f' as {a.asname}' if a.asname else ''}\n" for a in aliases]
        else:
            level = "." * (node.level + 1 if node.level else 0)
            lines += from_import(level, node.module or "", {f"{a.name} as {a.asname}" if a.asname else a.name
                                                           for a in aliases})
    local = list(local_first) + sections.get(4, [])
    for there in sorted(siblings):
        local += from_import(".", there, siblings[there])
    if local:
        sections[4] = local
    out: list[str] = []
    for section in sorted(sections):
        if out:
            out.append("\n")
        out += sections[section]
    return out


def _after_imports(body: list[str]) -> list[str]:
    """isort's blank lines after an import block: two before a def, class or decorator, else one."""
    first = next((line for line in body if line.strip()), "")
    return ["\n", "\n"] if re.match(r"(async\s+def|def|class|@)\b|@", first) else ["\n"]


def _docstring(text: str) -> list[str]:
    body = textwrap.dedent(text).strip("\n")
    first, _, rest = body.partition("\n")
    out = f'"""{first.strip()}\n{textwrap.dedent(rest)}' if rest else f'"""{first.strip()}'
    out = out.rstrip() + ('\n"""\n' if rest else '"""\n')
    return [line + "\n" for line in out.splitlines()]


def render_submodule(plan: Plan, sub: Sub) -> str:
    module = plan.module
    mine = [st for st in module.statements if plan.assignment.get(st.index) == sub.name]
    body_lines: list[str] = []
    last_index = None
    for st in mine:
        text = _edit_lines(st, plan)
        lead = st.lead
        if last_index is not None and st.index == last_index + 1:
            body_lines += lead + text  # the original's neighbour: its spacing and comments as they were
        else:
            body_lines += ["\n", "\n"] + _strip_leading(lead) + text
        last_index = st.index
    out = _docstring(sub.doc)
    out.append("\n")
    if module.future_annotations:
        out.append("from __future__ import annotations\n\n")
    typing_names = plan.typing_imports[sub.name]
    imports = import_block(module, _chains([st.node for st in mine]), plan.top_imports[sub.name])
    if typing_names and "TYPE_CHECKING" not in module.imported:
        imports.insert(0, "from typing import TYPE_CHECKING\n")  # ruff --fix --select I puts it in place
    out += imports
    if typing_names:
        out += ["\n", "if TYPE_CHECKING:  # annotations only: these submodules import this one\n"]
        for there in sorted(typing_names):
            out += from_import(".", there, typing_names[there], "    ")
    body = _strip_leading(body_lines)
    if imports or typing_names:
        out += _after_imports(body)
    out += body
    return "".join(out).rstrip("\n") + "\n"


def render_init(plan: Plan) -> str:
    module = plan.module
    split = module.split
    doc = module.docstring.rstrip("\n")
    layout = [f"Layout (made by ``tools/split_modules.py`` from the former ``nbhelpers/{split.module}.py``; each "
              f"submodule's docstring says what it owns):", ""]
    for sub in split.subs:
        first = textwrap.dedent(sub.doc).strip().splitlines()[0]
        layout.append(f"- :mod:`{PACKAGE}.{split.module}.{sub.name}`: {first[0].lower() + first[1:]}")
    layout += ["", f"Every name of the former module is importable from here, private ones included. The package is one "
               f"namespace with its submodules: setting a name on it (``monkeypatch.setattr({split.module}, "
               f"name, value)``) sets it in every submodule that holds it, so code that looks the name up at call "
               f"time sees the new value."]
    wrapped: list[str] = []
    for line in layout:
        if len(line) <= 116:
            wrapped.append(line)
        else:
            indent = "  " if line.startswith("- ") else ""
            wrapped += textwrap.wrap(line, 116, subsequent_indent=indent, break_on_hyphens=False,
                                     break_long_words=False)
    text = '"""' + doc + "\n\n" + "\n".join(wrapped) + '\n"""\n'
    out = [text, "\n", f"# ruff: noqa: F401 (re-exports)  {MARKER}; edit the submodules, not this list.\n"]
    if module.future_annotations:
        out.append("from __future__ import annotations\n\n")
    defined_in: dict[str, set[str]] = {}
    for st in module.statements:
        sub = plan.assignment.get(st.index)
        if sub and st.kind == "code":
            defined_in.setdefault(sub, set()).update(st.defines)
    out += import_block(module, None, defined_in, [f"from .. import {NAMESPACE_MODULE}\n"])
    out.append("\n")
    for st in module.statements:
        if st.kind == "all":
            out += _strip_blank(st.text) + ["\n"]
    out += [f"_SUBMODULES = ({', '.join(f'{n!r}'.replace(chr(39), chr(34)) for n in plan.order)})\n", "\n", f"{NAMESPACE_MODULE}.share(__name__, _SUBMODULES)\n"]
    return "".join(out)


def render_main(plan: Plan) -> str | None:
    module = plan.module
    mains = [st for st in module.statements if st.kind == "main"]
    if not mains:
        return None
    split = module.split
    out = _docstring(f"``python -m {PACKAGE}.{split.module}``: runs the command line of the former "
                     f"``{PACKAGE}/{split.module}.py``.")
    out.append("\n")
    used = _chains([st.node for st in mains])
    where = {n: plan.assignment[st.index] for st in module.statements if st.index in plan.assignment
             for n in st.defines}
    wanted: dict[str, set[str]] = {}
    for name in sorted(used[0]):
        if name in where:
            wanted.setdefault(where[name], set()).add(name)
    imports = import_block(module, used, wanted)
    body: list[str] = []
    for st in mains:
        body += _strip_blank(_edit_lines(st, plan)) + ["\n"]
    out += imports + _after_imports(body) + body
    return "".join(out).rstrip("\n") + "\n"


NAMESPACE_SOURCE = '''\
"""One namespace for a module split into a package (``tools/split_modules.py``): the package and its submodules.

``nbhelpers.gpu``, ``weights``, ``env`` and ``media`` were single modules; each is now a package whose submodules
own one concern and import what they use from each other. Setting a name on the package (as
``monkeypatch.setattr(gpu, "_read_report", fake)`` does) would change only the package's attribute, while the
submodules that use the name hold their own binding. :func:`share` makes such a set reach every submodule of the
package that holds the same object under that name, and a delete remove it there, so that the package behaves like
the one module it replaced.

Source: none (ours); module ``__class__`` assignment is the documented way to customise a module's attribute
setting (Python data model, "Customizing module attribute access").
"""

from __future__ import annotations

import sys
import types
from typing import Any

_PACKAGES: dict[str, tuple[str, ...]] = {}
_MISSING = object()


class SharedNamespace(types.ModuleType):
    """A package whose attribute sets and deletes also reach the submodules that hold the same name."""

    def __setattr__(self, name: str, value: Any) -> None:
        for module in _holders(self, name):
            setattr(module, name, value)
        super().__setattr__(name, value)

    def __delattr__(self, name: str) -> None:
        for module in _holders(self, name):
            delattr(module, name)
        super().__delattr__(name)


def _holders(package: types.ModuleType, name: str) -> list[types.ModuleType]:
    """The loaded submodules of ``package`` whose global ``name`` is the package's current value."""
    current = package.__dict__.get(name, _MISSING)
    if current is _MISSING or name.startswith("__"):
        return []
    out = []
    for sub in _PACKAGES.get(package.__name__, ()):
        module = sys.modules.get(f"{package.__name__}.{sub}")
        if module is not None and module.__dict__.get(name, _MISSING) is current:
            out.append(module)
    return out


def share(package_name: str, submodules: tuple[str, ...]) -> None:
    """Make the package ``package_name`` (already in ``sys.modules``) one namespace with its ``submodules``.

    Args:
        package_name: The package's ``__name__``.
        submodules: Names of its submodules (relative), all imported by the package's ``__init__``.
    """
    _PACKAGES[package_name] = tuple(submodules)
    sys.modules[package_name].__class__ = SharedNamespace
'''


# =====================================================================================================================
# The layout test
# =====================================================================================================================

LAYOUT_TEST_HEAD = '''\
"""The packages made from modules that mixed concerns (issue 13, ``tools/split_modules.py``).

Each of ``gpu``, ``weights``, ``env`` and ``media`` is a package whose submodules own one concern each (module
docstring first, at most {max_lines} lines), every name of the former flat module (listed below, as it was when the
split was made) is still importable from the package, every name a submodule holds is the package's same object,
and setting a name on the package reaches the submodules that use it (what ``monkeypatch.setattr`` relies on).
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "nbhelpers"
MAX_LINES = {max_lines}

pytestmark = pytest.mark.notorch

# {marker}: the namespace of each former module (defined names and its imports).
FORMER_NAMES = {{
'''

LAYOUT_TEST_TAIL = '''\
}


@pytest.mark.parametrize("name", sorted(FORMER_NAMES))
def test_each_split_module_is_a_package_of_documented_submodules(name):
    folder = PACKAGE / name
    assert not (PACKAGE / f"{name}.py").exists(), f"nbhelpers/{name}.py is back beside the package"
    assert (folder / "__init__.py").is_file()
    files = sorted(folder.glob("*.py"))
    assert len(files) >= 3, files
    for path in files:
        source = path.read_text(encoding="utf-8")
        doc = ast.get_docstring(ast.parse(source))
        assert doc and len(doc.split()) >= 5, f"{path.name}: no module docstring saying what it owns"
        lines = source.count("\\n")
        assert path.name == "__init__.py" or lines <= MAX_LINES, f"{path.name}: {lines} lines (at most {MAX_LINES})"


@pytest.mark.parametrize("name", sorted(FORMER_NAMES))
def test_every_former_name_is_importable_from_the_package(name):
    package = importlib.import_module(f"nbhelpers.{name}")
    missing = [n for n in FORMER_NAMES[name] if not hasattr(package, n)]
    assert not missing, f"nbhelpers.{name} lost {missing}"


def _submodules(package):
    return [importlib.import_module(f"{package.__name__}.{sub}") for sub in package._SUBMODULES]


@pytest.mark.parametrize("name", sorted(FORMER_NAMES))
def test_every_name_of_a_submodule_is_the_same_object_on_the_package(name):
    package = importlib.import_module(f"nbhelpers.{name}")
    for module in _submodules(package):
        for attr, value in vars(module).items():
            if attr.startswith("__") and attr.endswith("__"):
                continue
            assert getattr(package, attr, None) is value, f"{module.__name__}.{attr} is not nbhelpers.{name}.{attr}"


@pytest.mark.parametrize("name", sorted(FORMER_NAMES))
def test_setting_a_name_on_the_package_reaches_every_submodule_that_uses_it(name, monkeypatch):
    package = importlib.import_module(f"nbhelpers.{name}")
    modules = _submodules(package)
    names = sorted({attr for m in modules for attr in vars(m) if not attr.startswith("__")})
    assert names
    for attr in names:
        before = {m.__name__: vars(m)[attr] for m in modules if attr in vars(m)}
        holders = [m for m in modules if vars(m).get(attr, None) is getattr(package, attr)]
        sentinel = object()
        monkeypatch.setattr(package, attr, sentinel)
        assert getattr(package, attr) is sentinel
        for m in holders:
            assert vars(m)[attr] is sentinel, f"{m.__name__}.{attr} did not see the patch"
        monkeypatch.undo()
        after = {m.__name__: vars(m)[attr] for m in modules if attr in vars(m)}
        assert after == before and all(after[k] is before[k] for k in before), attr


def test_a_helper_patched_on_the_package_is_what_a_caller_in_another_submodule_uses(monkeypatch):
    from nbhelpers import gpu

    class Reached(Exception):
        pass

    def fake_report():
        raise Reached

    # plan() (gpu/planner.py) reads the device report through _read_report (gpu/device.py).
    monkeypatch.setattr(gpu, "_read_report", fake_report)
    with pytest.raises(Reached):
        gpu.plan("lipsync")
    monkeypatch.undo()
    assert gpu.planner._read_report is gpu.device._read_report is gpu.report


def test_the_packages_import_without_torch():
    code = ("import sys, nbhelpers, nbhelpers.gpu, nbhelpers.weights, nbhelpers.media, nbhelpers.env; "
            "bad = [m for m in ('torch', 'huggingface_hub', 'matplotlib', 'ipywidgets', 'cv2') if m in sys.modules]; "
            "print(bad); sys.exit(bool(bad))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_python_m_weights_still_runs_the_weights_command_line():
    proc = subprocess.run([sys.executable, "-m", "nbhelpers.weights", "--help"], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "list" in proc.stdout and "download" in proc.stdout and "verify" in proc.stdout
'''


def former_names(module: Module) -> list[str]:
    names = set(module.defined) | module.imported
    names.discard("annotations")  # from __future__
    return sorted(names)


def render_layout_test(names: dict[str, list[str]]) -> str:
    out = [LAYOUT_TEST_HEAD.format(max_lines=MAX_LINES, marker=MARKER)]
    for module in sorted(names):
        out.append(f"    {json.dumps(module)}: [\n")
        line = "       "
        for name in names[module]:
            item = f" {json.dumps(name)},"
            if len(line) + len(item) > 116:
                out.append(line + "\n")
                line = "       "
            line += item
        out.append(line + "\n    ],\n")
    out.append(LAYOUT_TEST_TAIL)
    return "".join(out)


def existing_layout_names(path: Path) -> dict[str, list[str]]:
    if not path.is_file():
        return {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "FORMER_NAMES"
                                                for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


# =====================================================================================================================
# Driver
# =====================================================================================================================


def _ruff(root: Path) -> str | None:
    for here in (Path(sys.executable).parent / "ruff", root / ".venv" / "bin" / "ruff"):
        if here.is_file():
            return str(here)
    return shutil.which("ruff")


def _git(*args: str) -> None:
    subprocess.run(["git", *args], cwd=ROOT, check=True)


def check(root: Path) -> list[str]:
    """Problems of the split packages (AST only: nothing is imported)."""
    problems: list[str] = []
    for split in SPLITS:
        flat, folder = root / PACKAGE / f"{split.module}.py", root / PACKAGE / split.module
        if flat.exists():
            problems.append(f"{flat.relative_to(root)} still exists (not split)")
        if not (folder / "__init__.py").is_file():
            problems.append(f"{folder.relative_to(root)}/__init__.py is missing")
            continue
        init = ast.parse((folder / "__init__.py").read_text(encoding="utf-8"))
        exported = {a.asname or a.name for n in ast.walk(init) if isinstance(n, ast.ImportFrom) for a in n.names}
        exported |= {a.asname or a.name.split(".")[0] for n in ast.walk(init) if isinstance(n, ast.Import)
                     for a in n.names}
        for path in sorted(folder.glob("*.py")):
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
            if not ast.get_docstring(tree):
                problems.append(f"{path.relative_to(root)}: no module docstring")
            lines = source.count("\n")
            if path.name != "__init__.py" and lines > MAX_LINES:
                problems.append(f"{path.relative_to(root)}: {lines} lines (at most {MAX_LINES})")
            if path.name in ("__init__.py", "__main__.py"):
                continue
            for node in tree.body:
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                for name in module_bindings(node) - exported:
                    problems.append(f"{path.relative_to(root)}: {name} is not re-exported by __init__")
    return problems


def split_one(split: Split, root: Path) -> tuple[Plan, dict[Path, str]]:
    module = read_module(split, root / PACKAGE / f"{split.module}.py")
    plan = plan_split(module)
    folder = root / PACKAGE / split.module
    files: dict[Path, str] = {folder / "__init__.py": render_init(plan)}
    for sub in split.subs:
        if any(plan.assignment.get(st.index) == sub.name for st in module.statements):
            files[folder / f"{sub.name}.py"] = render_submodule(plan, sub)
        else:
            plan.warnings.append(f"warning: {split.module}: submodule {sub.name} is empty; not written")
    main = render_main(plan)
    if main:
        files[folder / "__main__.py"] = main
    for path in files:
        compile(files[path], str(path), "exec")
    return plan, files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout to work on (default: this one)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan; write nothing")
    parser.add_argument("--check", action="store_true", help="verify the split packages; write nothing")
    parser.add_argument("--no-git", action="store_true", help="do not git rm / git add")
    parser.add_argument("--no-ruff", action="store_true", help="do not sort the generated imports with ruff")
    parser.add_argument("--only", nargs="*", default=None, help="modules to split (default: all four)")
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    if args.check:
        problems = check(root)
        print("\n".join(problems) or "split packages: ok")
        return 1 if problems else 0
    splits = [s for s in SPLITS if args.only is None or s.module in args.only]
    written: list[Path] = []
    names = existing_layout_names(root / LAYOUT_TEST)
    status = 0
    for split in splits:
        flat, folder = root / PACKAGE / f"{split.module}.py", root / PACKAGE / split.module
        if not flat.exists():
            if (folder / "__init__.py").is_file():
                print(f"{split.module}: already a package (no nbhelpers/{split.module}.py); nothing to do")
                continue
            print(f"{split.module}: neither nbhelpers/{split.module}.py nor a package", file=sys.stderr)
            status = 1
            continue
        if folder.exists() and not (folder / "__init__.py").read_text(encoding="utf-8").count(MARKER):
            raise SplitError(f"{folder} exists and was not made by this tool; remove it first")
        plan, files = split_one(split, root)
        for note in plan.warnings:
            print(note, file=sys.stderr)
        module = plan.module
        print(f"{split.module}: {len(module.lines)} lines ->")
        for path, text in files.items():
            owned = [st for st in module.statements if plan.assignment.get(st.index) == path.stem]
            names_here = sorted({n for st in owned for n in st.defines})
            print(f"  {path.relative_to(root)}: {text.count(chr(10))} lines" +
                  (f"  ({len(names_here)} names)" if names_here else ""))
            if args.dry_run and names_here:
                print(textwrap.indent(textwrap.fill(" ".join(names_here), 110), "      "))
        lazy = sum(len(v) for d in plan.lazy.values() for v in d.values())
        print(f"  names imported inside functions (calls into a later submodule): {lazy}")
        if args.dry_run:
            continue
        names[split.module] = former_names(module)
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        for path, text in files.items():
            path.write_text(text, encoding="utf-8")
            written.append(path)
        if args.no_git:
            flat.unlink()
        else:
            _git("rm", "-q", str(flat.relative_to(root)))
    if args.dry_run or not written:
        return status
    namespace_path = root / PACKAGE / f"{NAMESPACE_MODULE}.py"
    namespace_path.write_text(NAMESPACE_SOURCE, encoding="utf-8")
    test_path = root / LAYOUT_TEST
    test_path.write_text(render_layout_test(names), encoding="utf-8")
    written += [namespace_path, test_path]
    ruff = None if args.no_ruff else _ruff(root)
    if ruff:
        subprocess.run([ruff, "check", "--quiet", "--fix", "--select", "I", *map(str, written)], cwd=root,
                       check=False)
    else:
        print("ruff not found: imports are correct but may need `ruff check --fix --select I`", file=sys.stderr)
    if not args.no_git:
        _git("add", *[str(p.relative_to(root)) for p in written])
    problems = check(root) if set(s.module for s in splits) == {s.module for s in SPLITS} else []
    for problem in problems:
        print(f"check: {problem}", file=sys.stderr)
    return 1 if problems else status


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.exit(main())
