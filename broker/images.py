"""Custom images: which a job may name (the pool's allowlist) and how its pod may be reused.

A job may bring its own container image (`image`), which must match one of its pool's `images` patterns
(shell globs over the whole reference, `fnmatch`: `registry.example/team/*`, `repo@sha256:*`). A mutable
tag (no `@sha256:` digest) may point at other bytes tomorrow, so it runs on a single-use pod, deleted after
the job. A digest-pinned image names exactly one set of bytes: its pod may serve the same caller's later jobs
of that image, never another caller and never a job without an image; it counts against the pool's ceiling
and its accelerator budget, not its idle cap, and it retires when its owner's hold ends.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable

from broker.errors import ImageNotAllowed, ImagesUnsupported, InvalidRequest

_REFERENCE = re.compile(
    r"^[a-z0-9]+(?:[._-][a-z0-9]+)*(?:\.[a-z0-9-]+)*(?::[0-9]+)?"  # registry host (or first path part)
    r"(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"  # repository path
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"  # tag
    r"(?:@sha256:[0-9a-f]{64})?$"  # digest
)
_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")
MAX_IMAGE_CHARS = 512


def pinned(image: str) -> bool:
    """Digest-pinned (`...@sha256:<64 hex>`): the same bytes every time, so its pod may be reused."""
    return bool(_DIGEST.search(image))


def check_reference(image: str) -> None:
    """An image reference as a container runtime parses it; raises InvalidRequest otherwise."""
    if len(image) > MAX_IMAGE_CHARS or not _REFERENCE.match(image):
        raise InvalidRequest(f"image {image[:80]!r} is not an image reference (registry/repo[:tag][@sha256:digest])",
                             {"field": "image"})


def allowed(image: str, patterns: Iterable[str]) -> bool:
    """Whether any allowlist pattern matches the whole reference (case-sensitive)."""
    return any(fnmatch.fnmatchcase(image, pattern) for pattern in patterns)


def admit_image(image: str, pool: str, patterns: tuple[str, ...], runs_images: bool) -> None:
    """Refuse an image the backend cannot run or the pool does not allow; the typed error says which."""
    check_reference(image)
    if not runs_images:
        raise ImagesUnsupported("this broker's backend runs no container images (the local backend sandboxes "
                                "host processes): submit without `image`, or to a kubernetes broker",
                                {"image": image})
    if not allowed(image, patterns):
        raise ImageNotAllowed(f"image {image!r} is not allowed in pool {pool!r}"
                              + ("" if patterns else " (the pool allows no custom images)"),
                              {"image": image, "pool": pool, "allowed": list(patterns)})
