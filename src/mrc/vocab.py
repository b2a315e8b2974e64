"""The project's Chinese WordPiece vocab, the model tokenizer, and its fast (Rust) twin.

Offline there is no hub vocab, so one is built from the pre-training text: the special tokens first,
every CJK character seen, and WordPieces for latin words and digits (HF `tokenizers`' WordPiece trainer,
which splits CJK characters apart exactly as BERT's basic tokenizer does). The saved directory loads with
`paddlenlp.transformers.AutoTokenizer.from_pretrained(dir)`.

Bulk tokenisation (features, pre-training instances) goes through `fast_tokenizer`: HF's Rust
BertWordPiece on the same vocab.txt, ~36x faster than paddlenlp's Python tokenizer, same ids and offsets.
"""
import logging
from pathlib import Path
from typing import Iterable

from .errors import MRCError
from .metric import is_cjk

log = logging.getLogger("mrc.vocab")

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_vocab(texts: Iterable[str], out_dir, min_count: int = 1, max_size: int | None = None,
                wordpieces: int = 3000) -> Path:
    """Build a Chinese WordPiece vocab from `texts`; save vocab.txt + tokenizer config in `out_dir`.

    Entries: the special tokens; every character seen at least `min_count` times (so no CJK character of
    the text is [UNK]); the '##' form of every non-CJK character (CJK characters always stand alone);
    then up to `wordpieces` frequent multi-character latin/digit words, each also as a '##' continuation.
    Deterministic: the same texts give the same file (HF's WordPiece trainer breaks ties differently
    from one process to the next). `max_size` caps the total.
    """
    from collections import Counter

    from tokenizers.normalizers import BertNormalizer

    texts = list(texts)
    if not texts:
        raise MRCError(f"{out_dir}: cannot build a vocab from no text")
    normalizer = BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    pre_tokenizer = _pre_tokenizer()
    chars, words = Counter(), Counter()
    for text in texts:
        normalized = normalizer.normalize_str(text)
        chars.update(normalized)
        words.update(w for w, _ in pre_tokenizer.pre_tokenize_str(normalized) if len(w) > 1)
    alphabet = sorted(ch for ch, n in chars.items() if n >= min_count and not ch.isspace())
    continuations = ["##" + ch for ch in alphabet if not is_cjk(ord(ch))]
    frequent = [w for w, n in sorted(words.items(), key=lambda kv: (-kv[1], kv[0])) if n >= max(min_count, 2)]
    frequent = frequent[:wordpieces // 2]
    ordered = SPECIAL_TOKENS + alphabet + continuations
    ordered += [w for w in frequent] + ["##" + w for w in frequent]
    seen, unique = set(), []
    for token in ordered:
        if token not in seen:
            seen.add(token)
            unique.append(token)
    ordered = unique[:max_size] if max_size else unique
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from .io_utils import atomic_write_text

    atomic_write_text(out_dir / "vocab.txt", "\n".join(ordered) + "\n")
    from paddlenlp.transformers import BertTokenizer

    BertTokenizer(str(out_dir / "vocab.txt"), do_lower_case=True).save_pretrained(str(out_dir))
    log.info("vocab: %d entries (%d characters) from %d texts -> %s", len(ordered), len(alphabet), len(texts), out_dir)
    return out_dir


def _pre_tokenizer():
    """BERT's pre-tokenisation as paddlenlp does it: split on whitespace and punctuation, and also
    isolate symbols (Unicode S*, e.g. '～', and a few code points paddlenlp lists)."""
    from tokenizers import Regex, pre_tokenizers

    return pre_tokenizers.Sequence([
        pre_tokenizers.BertPreTokenizer(),
        pre_tokenizers.Split(Regex(r"[\p{S}\x{AD}\x{B2}\x{BA}\x{3007}\x{B5}\x{D8}\x{14B}\x{1B1}]"), "isolated"),
    ])


def load_tokenizer(name_or_dir):
    """paddlenlp tokenizer from a hub name or a directory; a missing dir is one clear line."""
    from paddlenlp.transformers import AutoTokenizer

    path = Path(str(name_or_dir))
    if (path.is_absolute() or str(name_or_dir).startswith(".")) and not path.is_dir():
        raise MRCError(f"{name_or_dir}: tokenizer directory not found")
    try:
        return AutoTokenizer.from_pretrained(str(name_or_dir))
    except Exception as err:  # hub unreachable or files missing: the caller decides what to do
        raise MRCError(f"{name_or_dir}: cannot load tokenizer ({type(err).__name__}: {str(err).splitlines()[0][:120]})") from None


def _wordpiece_vocab(tokenizer) -> dict:
    try:
        vocab = dict(tokenizer.get_vocab())
    except (AttributeError, NotImplementedError):
        vocab = {}
    if not vocab or tokenizer.unk_token not in vocab:
        raise MRCError(f"{type(tokenizer).__name__}: not a WordPiece vocab; the fast tokenizer needs one")
    return vocab


def fast_tokenizer(paddle_tokenizer):
    """HF Rust WordPiece tokenizer equivalent to a paddlenlp Bert/Ernie-style tokenizer (same vocab.txt)."""
    from tokenizers import BertWordPieceTokenizer

    lowercase = bool(getattr(paddle_tokenizer, "do_lower_case", True))
    fast = BertWordPieceTokenizer(
        _wordpiece_vocab(paddle_tokenizer), unk_token=paddle_tokenizer.unk_token, sep_token=paddle_tokenizer.sep_token,
        cls_token=paddle_tokenizer.cls_token, pad_token=paddle_tokenizer.pad_token, mask_token=paddle_tokenizer.mask_token,
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase, wordpieces_prefix="##",
    )
    tokenizer = fast._tokenizer  # the plain tokenizers.Tokenizer (encode / encode_batch with offsets)
    tokenizer.pre_tokenizer = _pre_tokenizer()  # paddlenlp also isolates symbols such as '～'
    return tokenizer


def vocab_texts(data_dir=None, max_corpus_lines=None) -> list[str]:
    """The text the project vocab is built from: the news corpus + passages and questions of the
    training sources (configs/default.yaml). Evaluation files (dev_public) never contribute."""
    from .data import EVAL_SOURCES, corpus_path, iter_passages, load_sources
    from .io_utils import load_yaml_config

    sources = [s for s in load_yaml_config("configs/default.yaml")["train_sources"] if s not in EVAL_SOURCES]
    df = load_sources(sources, data_dir=data_dir)
    texts = list(iter_passages(df)) + df["question"].tolist()
    corpus = corpus_path(data_dir)
    if corpus.exists():
        with open(corpus, encoding="utf-8") as f:
            texts += [line.strip() for i, line in enumerate(f) if line.strip() and (max_corpus_lines is None or i < max_corpus_lines)]
    return texts


def ensure_project_vocab(out_dir, data_dir=None) -> Path:
    """The offline vocab in `out_dir`, built once from `vocab_texts` when missing."""
    out_dir = Path(out_dir)
    if (out_dir / "vocab.txt").is_file() and (out_dir / "tokenizer_config.json").is_file():
        return out_dir
    log.info("building the project vocab in %s (no hub tokenizer offline)", out_dir)
    return build_vocab(vocab_texts(data_dir), out_dir)
