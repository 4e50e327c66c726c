"""A character corpus made on this machine: the Python standard library's own ``.py`` sources (``--dataset pysrc``),
which every installation ships, so no run downloads text. The files are read in sorted order, capped at
``CORPUS_CHARS`` and encoded with a fixed vocabulary; ``window`` cuts them into next-character examples. The corpus
differs between Python builds; ``CorpusSource`` records which one a run saw."""
from __future__ import annotations

import hashlib
import os
import sysconfig
from dataclasses import dataclass

import numpy as np
import torch

# The vocabulary: code 0 for any other character (tabs, non-ASCII), 1 for newline, then printable ASCII.
# Fixed rather than collected from the text, so the model's size never depends on the Python build.
OTHER, NEWLINE = 0, 1
PRINTABLE = "".join(chr(c) for c in range(32, 127))
VOCAB_SIZE = 2 + len(PRINTABLE)  # 97
# The first million characters of the sorted sources: quick to read and window, and about what the charlm task's
# steps read per rank at a few ranks, so a run sees its corpus about once.
CORPUS_CHARS = 1_000_000
# Directories under the standard library that hold installed packages or caches, not the library itself.
_NOT_STDLIB = frozenset({"site-packages", "dist-packages", "__pycache__"})

_CODE_OF = np.zeros(128, dtype=np.uint8)  # code point (ASCII) -> vocabulary code; other code points -> OTHER
_CODE_OF[ord("\n")] = NEWLINE
_CODE_OF[32:127] = np.arange(2, VOCAB_SIZE, dtype=np.uint8)


@dataclass(frozen=True, slots=True)
class CorpusSource:
    """What the corpus was: where its files came from, how many were read, its length and a short hash."""

    root: str
    files: int
    chars: int
    sha256: str  # first 12 hex digits of the SHA-256 of the text (UTF-8), to tell two builds' corpora apart

    def as_dict(self) -> dict:
        return {"root": self.root, "files": self.files, "chars": self.chars, "sha256": self.sha256}


def stdlib_root() -> str:
    return sysconfig.get_paths()["stdlib"]


def source_files(root: str) -> list[str]:
    """The ``.py`` files under ``root`` as sorted POSIX-style relative paths, installed packages left out."""
    found = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in _NOT_STDLIB]
        rel = os.path.relpath(directory, root)
        prefix = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        found += [prefix + name for name in names if name.endswith(".py")]
    return sorted(found)


def read_corpus(root: str, max_chars: int = CORPUS_CHARS) -> tuple[str, CorpusSource]:
    """The first ``max_chars`` characters of the files under ``root``, concatenated in sorted order."""
    parts, n_chars, n_files = [], 0, 0
    for rel in source_files(root):
        if n_chars >= max_chars:
            break
        # A few test files hold deliberately odd bytes; a replacement character becomes OTHER like any non-ASCII.
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            text = f.read(max_chars - n_chars)
        parts.append(text)
        n_chars += len(text)
        n_files += 1
    text = "".join(parts)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]
    return text, CorpusSource(root, n_files, len(text), digest)


def encode(text: str) -> np.ndarray:
    """Vocabulary codes (uint8) of ``text``, one per character."""
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    codes = np.full(len(points), OTHER, dtype=np.uint8)
    ascii_ = points < 128
    codes[ascii_] = _CODE_OF[points[ascii_]]
    return codes


def decode(codes) -> str:
    """The text of vocabulary codes, OTHER shown as U+FFFD (for reading samples and tests)."""
    chars = ["\ufffd", "\n", *PRINTABLE]
    return "".join(chars[int(c)] for c in codes)


def window(codes: np.ndarray, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping windows of ``context`` codes and their next-character targets, int64 ``(N, context)``: window i
    reads codes[i*context : (i+1)*context] and predicts the codes one later; a tail too short is dropped."""
    n = (len(codes) - 1) // context
    x = codes[:n * context].reshape(n, context)
    y = codes[1:n * context + 1].reshape(n, context)
    return torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y.astype(np.int64))
