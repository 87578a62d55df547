"""The Docker backend: one image per cell, built in layers from the exact wheels, tagged by its inputs' hash,
and one fresh container per suite.

    common     errors, paths inside the image, labels, validation of every value bound for the engine
    commands   a suite container's SDK options, the long `docker build` argument list, reading BuildKit's output
    engine     DockerEngine: the one door to the engine (containers through the Docker SDK, builds and image
               commands through the CLI and stackfarm.proc.call); engine_unavailable_reason for `--backend auto`
    base       the base image: a registry name, a tarball (`docker load`) or a rootfs folder (`docker import`)
    context    the build context per docker/Dockerfile stage (the stage table is stackfarm.stack's), the input
               hash and the tag
    backend    DockerBackend: realise / run_suite / properties (the backend protocol), the registry
    images     the record of which image a cell's work dir used, and removing unused ones (`cache prune`)
    bundling   bundle: a cell's image as a tarball for a runner without network

Everything is importable from here, as it was when this was one module.
"""

from __future__ import annotations

from .backend import (
    DEFAULT_TOOLS,
    DEFAULT_ULIMITS,
    PROPERTY_IMAGE,
    PROPERTY_IMAGE_DIGEST,
    PROPERTY_REPO_DIGEST,
    STACKFARM_SRC,
    TOOLS_INDEX,
    CellImage,
    DockerBackend,
    make,
    run_as,
)
from .base import (
    CUDA_IMAGE_VERSIONS,
    DEFAULT_BASE,
    BaseImages,
    base_for,
    check_base_python,
    cuda_image_version,
    hash_listing,
    is_base_path,
    rootfs_pythons,
)
from .bundling import bundle
from .commands import (
    BuildFailure,
    ContainerSpec,
    Mount,
    build_argv,
    create_options,
    failure_text,
    parse_build_failure,
    parse_loaded_image,
)
from .common import (
    CACHE_TAG,
    DEFAULT_SHM_SIZE,
    IMAGE_REPOSITORY,
    LABEL_CELL,
    LABEL_INPUTS,
    LABEL_RUN,
    OUT,
    PROJECT,
    REGISTRY_ENV,
    RUN_SPEC,
    SRC,
    USER,
    VENV,
    BuildError,
    DiskFullError,
    DockerError,
    EngineError,
    RegistryError,
    site_packages,
    validate_build_args,
    validate_image_ref,
    validate_registry,
    validate_shm_size,
    validate_ulimits,
)
from .context import (
    DOCKERFILE,
    STAGES,
    TOOLS_STAGE,
    context_digest,
    context_wheels,
    image_name,
    make_overlay,
    place_wheels,
    requirement_line,
    stage_wheels,
    write_context,
)
from .engine import MIN_ENGINE, DockerEngine, EngineInfo, ImageIdentity, engine_unavailable_reason
from .images import BUILD_LOG, ImageRecord, ImagesPruned, prune_images, read_records

__all__ = [
    "BUILD_LOG",
    "CACHE_TAG",
    "CUDA_IMAGE_VERSIONS",
    "DEFAULT_BASE",
    "DEFAULT_SHM_SIZE",
    "DEFAULT_TOOLS",
    "DEFAULT_ULIMITS",
    "DOCKERFILE",
    "IMAGE_REPOSITORY",
    "LABEL_CELL",
    "LABEL_INPUTS",
    "LABEL_RUN",
    "MIN_ENGINE",
    "OUT",
    "PROJECT",
    "PROPERTY_IMAGE",
    "PROPERTY_IMAGE_DIGEST",
    "PROPERTY_REPO_DIGEST",
    "REGISTRY_ENV",
    "RUN_SPEC",
    "SRC",
    "STACKFARM_SRC",
    "STAGES",
    "TOOLS_INDEX",
    "TOOLS_STAGE",
    "USER",
    "VENV",
    "BaseImages",
    "BuildError",
    "BuildFailure",
    "CellImage",
    "ContainerSpec",
    "DiskFullError",
    "DockerBackend",
    "DockerEngine",
    "DockerError",
    "EngineError",
    "EngineInfo",
    "ImageIdentity",
    "ImageRecord",
    "ImagesPruned",
    "Mount",
    "RegistryError",
    "base_for",
    "build_argv",
    "bundle",
    "check_base_python",
    "context_digest",
    "context_wheels",
    "create_options",
    "cuda_image_version",
    "engine_unavailable_reason",
    "failure_text",
    "hash_listing",
    "image_name",
    "is_base_path",
    "make",
    "make_overlay",
    "parse_build_failure",
    "parse_loaded_image",
    "place_wheels",
    "prune_images",
    "read_records",
    "requirement_line",
    "rootfs_pythons",
    "run_as",
    "site_packages",
    "stage_wheels",
    "validate_build_args",
    "validate_image_ref",
    "validate_registry",
    "validate_shm_size",
    "validate_ulimits",
    "write_context",
]
