"""Container images in a cluster profile: how any image starts ([container]) and what one family of images needs
([containers."PATTERN"]), resolved for one image into a `ContainerSetup`.

A site's images differ in how they start and what they need: LUMI's AI Factory images start with
``singularity run`` after LUMI's bindings module is loaded; its earlier ``lumi-pytorch-rocm`` images activate
with ``$WITH_CONDA`` and need the network libraries bound by hand, and were run with RCCL variables that a
newer image must not get. The first [containers] table whose pattern (shell-style, ``*`` and ``?``) matches
the image's file name applies: its exec and activate replace [container]'s, its binds add to them, its
modules and environment come with it. No table matching leaves [container]'s settings alone.

NVIDIA clusters start containers through pyxis, SLURM's plugin for enroot: ``exec = "pyxis"`` has srun
start the image itself (``srun --container-image=IMAGE --container-mounts=SRC[:DST],...
--container-workdir=DIR``, the flags pyxis documents) instead of wrapping the program in a container
command. The image is a registry reference (``nvcr.io#nvidia/pytorch:24.10-py3``) or a squashfs file; the
binds become the mounts, after the job's own folder, which is mounted at its own path and is the workdir
unless ``workdir`` names another.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field, fields
from typing import Any

from gpuscale.slurm.values import ENV_NAME, check_keys, shell_word

__all__ = ["PYXIS", "Container", "ContainerImage", "ContainerSetup", "resolve", "container_from_dict", "images_from_dict",
           "check_containers", "activate_script", "in_container"]


@dataclass(frozen=True, kw_only=True)
class Container:
    """How to start Python inside the cluster's container image."""

    exec: str = "singularity exec"
    """Command that runs a program in an image: `<exec> [--bind ...] IMAGE program`; "pyxis": srun starts the image
    (`--container-image`, `--container-mounts`, `--container-workdir`)."""
    activate: str | None = None
    """Shell text run inside the container first (LUMI: $WITH_CONDA), expanded there."""
    binds: tuple[str, ...] = ()
    """Host paths the container needs (network libraries, SLURM's spool for RCCL)."""
    image: str | None = None
    """Default image, if the site has one; --container overrides it."""
    workdir: str | None = None
    """pyxis: the folder the program starts in inside the image (default: the job's folder, mounted at its path)."""


PYXIS = "pyxis"
"""The exec value of images that srun starts itself, through pyxis and enroot."""


@dataclass(frozen=True, kw_only=True)
class ContainerImage:
    """What one family of container images needs (a ``[containers."PATTERN"]`` table)."""

    exec: str | None = None
    """Replaces [container]'s exec for these images (LUMI's AI Factory images: `singularity run`)."""
    activate: str | None = None
    """Replaces [container]'s activate for these images ("" for none)."""
    binds: tuple[str, ...] = ()
    """Host paths to bind, in addition to [container]'s."""
    module_use: tuple[str, ...] = ()
    """Module folders to add (`module use PATH`) before the modules are loaded."""
    modules: tuple[str, ...] = ()
    """Modules to load in the batch shell before srun (LUMI: the bindings module, which binds the network and
    the file systems)."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment these images need (exported in the batch shell; Singularity passes it in)."""


@dataclass(frozen=True)
class ContainerSetup:
    """How one image is started, resolved from [container] and the first matching [containers."PATTERN"]."""

    image: str
    exec: str
    activate: str | None
    binds: tuple[str, ...]
    module_use: tuple[str, ...]
    modules: tuple[str, ...]
    env: dict[str, str]
    pattern: str | None
    """The [containers] pattern that matched the image's file name; None when none did."""
    workdir: str | None = None
    """pyxis: --container-workdir (None: the job's folder)."""

    @property
    def pyxis(self) -> bool:
        """srun starts this image itself (pyxis), rather than a container command inside the step."""
        return self.exec == PYXIS


def resolve(base: Container, images: dict[str, ContainerImage], image: str, pattern: str | None = None) -> ContainerSetup:
    """How `image` starts: `base` with the first of `images` whose pattern matches the image's file name (or the one
    `pattern` names)."""
    name = image.rstrip("/").rsplit("/", 1)[-1]
    if pattern is None:
        pattern = next((p for p in images if fnmatch.fnmatchcase(name, p)), None)
    extra = images[pattern] if pattern is not None else ContainerImage()
    activate = base.activate if extra.activate is None else (extra.activate or None)
    binds = tuple(dict.fromkeys((*base.binds, *extra.binds)))  # in order, each once
    return ContainerSetup(image=image, exec=extra.exec or base.exec, activate=activate, binds=binds,
                          module_use=extra.module_use, modules=extra.modules, env=dict(extra.env), pattern=pattern,
                          workdir=base.workdir)


def check_containers(container: Container | None, images: dict[str, ContainerImage], where: str) -> None:
    """[container] and every [containers."PATTERN"] table are usable; image tables need a [container] table."""
    if container is not None:
        _check_container(container, where)
    if images and container is None:
        raise ValueError(f"{where}: [containers.\"...\"] tables need a [container] table that says how to start an image")
    for pattern, image in images.items():
        _check_image(pattern, image, where)


def _check_container(container: Container, where: str) -> None:
    if not isinstance(container.exec, str) or not container.exec.strip():
        raise ValueError(f"{where} [container]: exec={container.exec!r} must be a command, e.g. exec = \"singularity exec\"")
    for key in ("activate", "image", "workdir"):
        if getattr(container, key) is not None and not isinstance(getattr(container, key), str):
            raise ValueError(f"{where} [container]: {key}={getattr(container, key)!r} must be a string")
    if not all(isinstance(b, str) for b in container.binds):
        raise ValueError(f"{where} [container]: binds must be a list of paths, e.g. binds = [\"/opt/cray\"]")


def _check_image(pattern: Any, image: ContainerImage, where: str) -> None:
    """A [containers."PATTERN"] table: a file-name pattern on one line, text values, environment names."""
    table = f"[containers.{json.dumps(str(pattern))}]"
    if not isinstance(pattern, str) or not pattern or not pattern.isprintable() or "/" in pattern:
        raise ValueError(f"{where} {table}: the pattern must match an image's file name (no '/'), e.g. \"lumi-pytorch-*.sif\"")
    for key in ("exec", "activate"):
        value = getattr(image, key)
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{where} {table}: {key}={value!r} must be a string")
    if image.exec is not None and not image.exec.strip():
        raise ValueError(f"{where} {table}: exec must be a command, e.g. exec = \"singularity run\"")
    for key in image.env:
        if not isinstance(key, str) or not ENV_NAME.match(key):
            raise ValueError(f"{where} {table}: env key {key!r} is not a valid environment variable name")


_CONTAINER_KEYS = {f.name for f in fields(Container)}
_IMAGE_KEYS = {f.name for f in fields(ContainerImage)}


def container_from_dict(raw: Any, where: str) -> Container:
    """The [container] table of parsed TOML."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: container must be a table: [container] with exec, activate, binds, image")
    check_keys(raw, _CONTAINER_KEYS, f"{where} [container]")
    values = dict(raw)
    if not isinstance(values.get("binds", []), list):
        raise ValueError(f"{where} [container]: binds must be a list of paths, e.g. binds = [\"/opt/cray\"]")
    values["binds"] = tuple(values.get("binds", ()))
    return Container(**values)


def _string_list(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"{what} must be a list of strings, e.g. [\"...\", \"...\"]")
    return tuple(value)


def images_from_dict(tables: Any, where: str) -> dict[str, ContainerImage]:
    """The [containers."PATTERN"] tables, in the file's order (the first match wins)."""
    if not isinstance(tables, dict):
        raise ValueError(f"{where}: containers must be tables: [containers.\"lumi-pytorch-*\"] with binds, modules, env")
    images = {}
    for pattern, raw in tables.items():
        table = f"{where} [containers.{json.dumps(str(pattern))}]"
        if not isinstance(raw, dict):
            raise ValueError(f"{table} must be a table with exec, activate, binds, module_use, modules, env")
        check_keys(raw, _IMAGE_KEYS, table)
        values = dict(raw)
        for key in ("binds", "module_use", "modules"):
            if key in values:
                values[key] = _string_list(values[key], f"{table}: {key}")
        env = values.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise ValueError(f"{table}: env must be a table of NAME = \"value\" strings")
        images[pattern] = ContainerImage(**values)
    return images


def activate_script(venv: str) -> str:
    """The shell word that names a virtual environment's activate script."""
    return shell_word(venv.rstrip("/") + "/bin/activate")


def in_container(image: ContainerSetup, venv: str | None, inner: str) -> str:
    """A task's command inside the container: the image's own activation, then the virtual environment's (made in
    the image, on its Python), then `inner`; nothing runs if one of them fails."""
    steps = [image.activate] if image.activate else []
    if venv:
        steps.append(f"source -- {activate_script(venv)}")
    return " && ".join([*steps, f"{{ {inner}; }}"]) if steps else inner
