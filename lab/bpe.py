"""Time the course-exact BPE trainer and Tokenizer on CPU.

    python -m lab.bpe --vocab_size 32000                       # the default corpus
    python -m lab.bpe --text train.txt --max_mb 5 --vocab_size 10000
    python -m lab.bpe --text train.txt --gpt2_dir DIR          # GPT-2 vocab encoding only
    python -m lab.bpe --vocab_size 2048 --compare_hf --hf_encode --json out.json

Without ``--text`` the corpus is the training script's default: the running interpreter's standard-library
sources (``stdlib_source_files``), joined with ``<|endoftext|>`` into a temporary file. Reports, one line
each: ``train_bpe`` seconds; with ``--compare_hf``, HF ``tokenizers`` training on the same file and the first
merge where the two trainers disagree; with ``--encode``, ``Tokenizer.encode`` throughput with the trained
vocabulary; with ``--hf_encode``, the training script's own encoder (HF ``tokenizers``, all cores, as
``prepare_data`` runs it) with the HF-trained vocabulary; with ``--gpt2_dir`` (a folder holding GPT-2's
``encoder.json`` and ``vocab.bpe``, or ``vocab.json`` and ``merges.txt``), ``Tokenizer.encode`` throughput with
GPT-2's vocabulary. ``--json`` also writes the lines as a results file (results.write_results).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cs336_basics.data.bpe import train_bpe, usable_cores
from cs336_basics.data.bpe_tokenizer import Tokenizer
from cs336_basics.data.sources import stdlib_source_files
from cs336_basics.data.tokenizer import END_OF_TEXT, BPETokenizer
from cs336_basics.errors import report_error
from cs336_basics.measure.results import append_runs, schema_record


def _corpus(args: argparse.Namespace, folder: Path) -> tuple[Path, str]:
    if args.text is None:
        path = folder / "stdlib.txt"
        files = stdlib_source_files()
        with open(path, "w", encoding="utf-8") as out:
            for f in files:
                # As the training script reads them: invalid UTF-8 (a few test fixtures) becomes U+FFFD.
                out.write(f.read_bytes().decode("utf-8", errors="replace") + END_OF_TEXT)
        return path, f"stdlib sources ({len(files)} files)"
    if args.max_mb is None:
        return Path(args.text), str(args.text)
    path = folder / "head.txt"
    data = Path(args.text).read_bytes()[: int(args.max_mb * 1e6)]
    path.write_text(data.decode("utf-8", errors="ignore"), encoding="utf-8")  # drop a split last character
    return path, f"first {args.max_mb} MB of {args.text}"


def _gpt2_files(folder: Path) -> tuple[Path, Path]:
    for vocab, merges in (("encoder.json", "vocab.bpe"), ("vocab.json", "merges.txt")):
        if (folder / vocab).is_file() and (folder / merges).is_file():
            return folder / vocab, folder / merges
    raise FileNotFoundError(f"{folder} holds neither encoder.json + vocab.bpe nor vocab.json + merges.txt.")


_RECORDS: list[dict] = []
_CORPUS: dict = {}


def _report(**fields) -> None:
    print(json.dumps(fields), flush=True)
    if "corpus" in fields:
        _CORPUS.update(corpus=fields["corpus"], corpus_mb=fields["mb"], cores=fields["cores"])
    else:  # a measurement: a results record that names its corpus
        _RECORDS.append(schema_record(status="ok", **_CORPUS, **fields))


def _time_encode(encode, text_bytes: int, what: str, **fields) -> None:
    start = time.perf_counter()
    tokens = encode()
    seconds = time.perf_counter() - start
    megabytes = text_bytes / 1e6
    _report(what=what, mb=round(megabytes, 2), tokens=tokens, seconds=round(seconds, 2),
            mb_per_s=round(megabytes / seconds, 2), **fields)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text", help="a UTF-8 text file (default: the stdlib corpus)")
    parser.add_argument("--max_mb", type=float, help="use only the first MB (10^6 bytes) of --text")
    parser.add_argument("--vocab_size", type=int, default=10000)
    parser.add_argument("--num_processes", type=int, help="pre-tokenization processes (default: usable cores)")
    parser.add_argument("--compare_hf", action="store_true", help="also train HF tokenizers' BPE and compare")
    parser.add_argument("--encode", action="store_true", help="time Tokenizer.encode with the trained vocab")
    parser.add_argument("--hf_encode", action="store_true", help="time the training script's HF encoder (--compare_hf)")
    parser.add_argument("--gpt2_dir", type=Path, help="time Tokenizer.encode with GPT-2's vocab (skips training)")
    parser.add_argument("--json", help="also write the measurements here as a results file")
    args = parser.parse_args(argv)
    if args.hf_encode and not args.compare_hf:
        return report_error(ValueError("--hf_encode times the HF-trained vocabulary: add --compare_hf."))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path, label = _corpus(args, Path(tmp))
            megabytes = path.stat().st_size / 1e6
            _report(corpus=label, mb=round(megabytes, 2), cores=usable_cores(), cpus=os.cpu_count())
            text = path.read_text(encoding="utf-8")
            if args.gpt2_dir is not None:
                tok = Tokenizer.from_files(*_gpt2_files(args.gpt2_dir), special_tokens=[END_OF_TEXT])
                encode = lambda: len(tok.encode(text))  # noqa: E731
                _time_encode(encode, path.stat().st_size, "Tokenizer.encode, GPT-2 vocab", vocab_size=len(tok.vocab))
                return _finish(args)
            start = time.perf_counter()
            vocab, merges = train_bpe(path, args.vocab_size, [END_OF_TEXT], num_processes=args.num_processes)
            _report(what="train_bpe", vocab_size=len(vocab), mb=round(megabytes, 2),
                    seconds=round(time.perf_counter() - start, 2))  # fmt: skip
            if args.compare_hf:
                start = time.perf_counter()
                hf = BPETokenizer.train([path], args.vocab_size, show_progress=False)
                seconds = time.perf_counter() - start
                hf.save(Path(tmp) / "hf")
                hf_merges = Tokenizer.from_files(Path(tmp) / "hf/vocab.json", Path(tmp) / "hf/merges.txt").merges
                first = next((i for i, (a, b) in enumerate(zip(merges, hf_merges, strict=False)) if a != b), None)
                _report(what="HF tokenizers BpeTrainer", vocab_size=hf.vocab_size, mb=round(megabytes, 2),
                        seconds=round(seconds, 2), first_different_merge=first,
                        ours=repr(merges[first]) if first is not None else None,
                        hf=repr(hf_merges[first]) if first is not None else None)  # fmt: skip
                if args.hf_encode:
                    out = Path(tmp) / "hf-encoded.npy"

                    def encode() -> int:
                        hf.encode_files([path], out, show_progress=False)
                        return int(np.load(out, mmap_mode="r").size)

                    _time_encode(encode, path.stat().st_size, "BPETokenizer.encode_files (train_h100.py's encoder)",
                                 vocab_size=hf.vocab_size)  # fmt: skip
            if args.encode:
                tok = Tokenizer(vocab, merges, [END_OF_TEXT])
                encode = lambda: len(tok.encode(text))  # noqa: E731
                _time_encode(encode, path.stat().st_size, "Tokenizer.encode, trained vocab", vocab_size=len(vocab))
    except (OSError, ValueError) as e:
        return report_error(e)
    return _finish(args)


def _finish(args: argparse.Namespace) -> int:
    if args.json:
        append_runs(args.json, _RECORDS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
