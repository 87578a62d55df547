"""The Docker backend: one image per cell, built in layers from the exact wheels, tagged by its inputs' hash,
and one fresh container per suite.

    common     errors, paths inside the image, labels, validation of every value bound for the engine (the
               grammar itself is stackfarm.dockergrammar, which matrix.toml's schema reads too)
    commands   a suite container's SDK options, the long `docker build` argument list, reading BuildKit's output
    engine     DockerEngine: the one door to the engine (containers through the Docker SDK, builds and image
               commands through the CLI and stackfarm.proc.call); engine_unavailable_reason for `--backend auto`
    base       the base image: a registry name, a tarball (`docker load`) or a rootfs folder (`docker import`)
    context    the build context per docker/Dockerfile stage (the stage table is stackfarm.stack's), the input
               hash and the tag
    backend    DockerBackend: realise / run_suite / properties (the backend protocol), the registry; `make`,
               which stackfarm.backends.get_backend calls
    images     the record of which image a cell's work dir used, and removing unused ones (`cache prune`)
    bundling   bundle: a cell's image as a tarball for a runner without network

The face is what the rest of stackfarm uses (the backend, its error, `make`, `bundle` and the engine probe of
`--backend auto`); everything else is imported from its module. It re-exported all 73 names of the one module
this package once was.
"""

from __future__ import annotations

from .backend import DockerBackend, make
from .bundling import bundle
from .common import DockerError
from .engine import engine_unavailable_reason

__all__ = ["DockerBackend", "DockerError", "bundle", "engine_unavailable_reason", "make"]
