"""The character corpus (``pipesgd.train.text``) and its data set ``pysrc``: which files, in which order, the
vocabulary, next-character windows, and a held-out split that no training window overlaps."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipesgd.train import text
from pipesgd.train.data import DataError, load_pysrc


def _tree(root, files: dict[str, str]) -> None:
    for rel, body in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(body, encoding="utf-8")


def test_source_files_are_sorted_and_leave_out_installed_packages(tmp_path):
    _tree(tmp_path, {"b.py": "", "a.py": "", "pkg/z.py": "", "pkg/sub/y.py": "", "notes.txt": "",
                     "site-packages/numpy/x.py": "", "dist-packages/x.py": "", "__pycache__/a.py": ""})
    assert text.source_files(str(tmp_path)) == ["a.py", "b.py", "pkg/sub/y.py", "pkg/z.py"]


def test_read_corpus_concatenates_in_order_up_to_the_cap(tmp_path):
    _tree(tmp_path, {"a.py": "abc\n", "b.py": "defgh\n", "c.py": "never read\n"})
    corpus, source = text.read_corpus(str(tmp_path), max_chars=7)
    assert corpus == "abc\ndef"  # the file that crosses the cap is cut; the next one is not opened
    assert (source.files, source.chars, source.root) == (2, 7, str(tmp_path))
    again, same = text.read_corpus(str(tmp_path), max_chars=7)
    assert again == corpus and same == source
    other = text.read_corpus(str(tmp_path), max_chars=8)[1]
    assert len(source.sha256) == 12 and other.sha256 != source.sha256


def test_the_vocabulary_maps_printable_ascii_and_newline_and_nothing_else():
    assert text.VOCAB_SIZE == 97
    sample = "def f(x):\n    return x ~ 1\n"
    codes = text.encode(sample)
    assert codes.dtype == np.uint8 and len(codes) == len(sample)
    assert text.decode(codes) == sample
    assert sorted(text.encode(text.PRINTABLE + "\n")) == list(range(1, 97))  # each its own code, none OTHER
    assert text.encode("\té€\r").tolist() == [text.OTHER] * 4  # one OTHER per character, not per UTF-8 byte


def test_windows_predict_the_next_character():
    codes = np.arange(23, dtype=np.uint8)
    x, y = text.window(codes, context=5)
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (4, 5)  # (23 - 1) // 5 windows
    assert torch.equal(y, x + 1)
    assert x[1].tolist() == [5, 6, 7, 8, 9] and int(y[-1, -1]) == 20


def test_the_held_out_split_is_the_corpus_tail_and_overlaps_no_training_window(tmp_path):
    rng = np.random.default_rng(0)
    body = "".join(rng.choice(list(text.PRINTABLE + "\n"), size=3000))
    _tree(tmp_path, {"m.py": body})
    ds = load_pysrc(str(tmp_path), context=16, max_chars=2000, test_chars=400)
    split = 2000 - 400
    n_train, n_test = len(ds.x_train), len(ds.x_test)
    assert (n_train, n_test) == ((split - 1) // 16, (400 - 1) // 16)
    # Training windows read (and predict) characters before ``split`` only; test windows start at it.
    assert text.decode(ds.x_train.flatten()) == body[:n_train * 16] and n_train * 16 + 1 <= split
    assert text.decode(ds.y_train[-1]) == body[n_train * 16 - 15:n_train * 16 + 1]
    assert text.decode(ds.x_test.flatten()) == body[split:split + n_test * 16]
    assert ds.num_classes == text.VOCAB_SIZE and ds.input_shape == (16,)
    assert ds.source["files"] == 1 and ds.source["chars"] == 2000


def test_too_little_text_is_a_data_error(tmp_path):
    _tree(tmp_path, {"m.py": "x = 1\n" * 10})
    with pytest.raises(DataError, match="only 60 characters of Python sources"):
        load_pysrc(str(tmp_path), test_chars=50)


def test_pysrc_from_this_machines_standard_library_is_deterministic():
    first, second = load_pysrc(), load_pysrc()
    assert first.source == second.source and first.source["chars"] == text.CORPUS_CHARS
    assert first.source["root"] == text.stdlib_root() and first.source["files"] > 1
    for a, b in ((first.x_train, second.x_train), (first.y_test, second.y_test)):
        assert torch.equal(a, b)
    assert first.x_train.shape[1] == 64 and int(first.x_train.max()) < text.VOCAB_SIZE
    # Python source: the space is the most frequent character, the newline among the most frequent.
    counts = torch.bincount(first.x_train.flatten(), minlength=text.VOCAB_SIZE)
    assert int(counts.argmax()) == int(text.encode(" ")[0])
    assert int(counts[text.NEWLINE]) > counts.sum() // 50
