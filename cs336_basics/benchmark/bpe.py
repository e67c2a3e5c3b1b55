"""Time the course-exact BPE trainer and Tokenizer on CPU.

    python -m cs336_basics.benchmark.bpe --vocab_size 32000                       # the default corpus
    python -m cs336_basics.benchmark.bpe --text train.txt --max_mb 5 --vocab_size 10000
    python -m cs336_basics.benchmark.bpe --text train.txt --gpt2_dir DIR          # GPT-2 vocab encoding only

Without ``--text`` the corpus is the training script's default: the running interpreter's standard-library
sources (``stdlib_source_files``), joined with ``<|endoftext|>`` into a temporary file. Reports, one line
each: ``train_bpe`` seconds; with ``--compare_hf``, HF ``tokenizers`` training on the same file and the first
merge where the two trainers disagree; with ``--encode``, ``Tokenizer.encode`` throughput with the trained
vocabulary; with ``--gpt2_dir`` (a folder holding GPT-2's ``encoder.json`` and ``vocab.bpe``, or
``vocab.json`` and ``merges.txt``), ``Tokenizer.encode`` throughput with GPT-2's vocabulary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from cs336_basics.data.bpe import train_bpe, usable_cores
from cs336_basics.data.bpe_tokenizer import Tokenizer
from cs336_basics.data.sources import stdlib_source_files
from cs336_basics.data.tokenizer import END_OF_TEXT, BPETokenizer
from cs336_basics.errors import report_error


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


def _report(**fields) -> None:
    print(json.dumps(fields), flush=True)


def _time_encode(tok: Tokenizer, text: str, what: str) -> None:
    start = time.perf_counter()
    ids = tok.encode(text)
    seconds = time.perf_counter() - start
    megabytes = len(text.encode("utf-8")) / 1e6
    _report(what=what, mb=round(megabytes, 2), tokens=len(ids), seconds=round(seconds, 2),
            mb_per_s=round(megabytes / seconds, 2))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--text", help="a UTF-8 text file (default: the stdlib corpus)")
    parser.add_argument("--max_mb", type=float, help="use only the first MB (10^6 bytes) of --text")
    parser.add_argument("--vocab_size", type=int, default=10000)
    parser.add_argument("--num_processes", type=int, help="pre-tokenization processes (default: usable cores)")
    parser.add_argument("--compare_hf", action="store_true", help="also train HF tokenizers' BPE and compare")
    parser.add_argument("--encode", action="store_true", help="time Tokenizer.encode with the trained vocab")
    parser.add_argument("--gpt2_dir", type=Path, help="time Tokenizer.encode with GPT-2's vocab (skips training)")
    args = parser.parse_args(argv)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path, label = _corpus(args, Path(tmp))
            megabytes = path.stat().st_size / 1e6
            _report(corpus=label, mb=round(megabytes, 2), cores=usable_cores(), cpus=os.cpu_count())
            if args.gpt2_dir is not None:
                tok = Tokenizer.from_files(*_gpt2_files(args.gpt2_dir), special_tokens=[END_OF_TEXT])
                _time_encode(tok, path.read_text(encoding="utf-8"), "Tokenizer.encode, GPT-2 vocab (50,257)")
                return 0
            start = time.perf_counter()
            vocab, merges = train_bpe(path, args.vocab_size, [END_OF_TEXT], num_processes=args.num_processes)
            _report(what="train_bpe", vocab_size=len(vocab), seconds=round(time.perf_counter() - start, 2))
            if args.compare_hf:
                start = time.perf_counter()
                hf = BPETokenizer.train([path], args.vocab_size, show_progress=False)
                seconds = time.perf_counter() - start
                hf.save(Path(tmp) / "hf")
                hf_merges = Tokenizer.from_files(Path(tmp) / "hf/vocab.json", Path(tmp) / "hf/merges.txt").merges
                first = next((i for i, (a, b) in enumerate(zip(merges, hf_merges, strict=False)) if a != b), None)
                _report(what="HF tokenizers BpeTrainer", seconds=round(seconds, 2), first_different_merge=first,
                        ours=repr(merges[first]) if first is not None else None,
                        hf=repr(hf_merges[first]) if first is not None else None)  # fmt: skip
            if args.encode:
                tok = Tokenizer(vocab, merges, [END_OF_TEXT])
                _time_encode(tok, path.read_text(encoding="utf-8"), f"Tokenizer.encode, trained vocab ({len(vocab)})")
    except (OSError, ValueError) as e:
        return report_error(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())
