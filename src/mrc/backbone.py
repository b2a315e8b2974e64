"""Which encoder a run uses, and loading it: hub name, local dir, own pre-training, or random init.

`--model NAME` (configs/models/NAME.yaml) resolves, in order, to
  1. the hub checkpoint (when reachable; skipped with MRC_OFFLINE=1),
  2. outputs/pretrain/<recipe>/ (the project's own `bash run.sh pretrain --recipe <recipe>`),
  3. random init of the same architecture at the profile's small size with the project vocab.
`--model DIR` uses the directory as it is. The choice and the reason are always logged: no silent fallback.
"""
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from .errors import MRCError
from .io_utils import REPO_ROOT, load_yaml_config

log = logging.getLogger("mrc.backbone")

MODELS_DIR = REPO_ROOT / "configs" / "models"
WEIGHT_FILES = ("model_state.pdparams", "model.safetensors", "model_state.safetensors")


@dataclass
class BackboneSpec:
    name: str                 # what the user asked for
    kind: str                 # hub | local | pretrained | random
    arch: str                 # bert | ernie | albert
    source: str               # hub name or directory (random: the vocab dir)
    tokenizer_source: str     # hub name or directory
    config: dict = field(default_factory=dict)  # random init: architecture sizes
    reason: str = ""

    def describe(self) -> str:
        return f"backbone {self.name}: {self.kind} ({arch_classes(self.arch).model.__name__} from {self.source}){' — ' + self.reason if self.reason else ''}"


def arch_classes(arch: str) -> SimpleNamespace:
    """paddlenlp classes of one architecture family."""
    import paddlenlp.transformers as T

    families = {
        "bert": ("BertConfig", "BertModel", "BertForPretraining", "BertTokenizer"),
        "ernie": ("ErnieConfig", "ErnieModel", "ErnieForPretraining", "ErnieTokenizer"),
        "albert": ("AlbertConfig", "AlbertModel", "AlbertForPretraining", "AlbertTokenizer"),
    }
    if arch not in families:
        raise MRCError(f"unknown architecture '{arch}' (known: {', '.join(families)})")
    names = families[arch]
    return SimpleNamespace(**{k: getattr(T, n) for k, n in zip(("config", "model", "pretraining", "tokenizer"), names)})


def known_models() -> list[str]:
    return sorted(p.stem for p in MODELS_DIR.glob("*.yaml") if p.stem != "offline_sizes")


def offline_sizes(profile: str) -> dict:
    sizes = load_yaml_config(MODELS_DIR / "offline_sizes.yaml")
    if profile not in sizes:
        log.info("profile %s has no offline size; using the cpu size", profile)
        profile = "cpu"
    return dict(sizes[profile])


def has_weights(path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / "config.json").is_file() and any((path / f).is_file() for f in WEIGHT_FILES)


def arch_of_dir(path) -> str:
    """Architecture family of a save_pretrained directory, from its config.json."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MRCError(f"{path}: not a checkpoint directory (no config.json)") from None
    except json.JSONDecodeError as err:
        raise MRCError(f"{path}/config.json: malformed JSON ({err.msg})") from None
    hint = " ".join([str(config.get("model_type", ""))] + [str(a) for a in config.get("architectures", [])]).lower()
    for arch in ("ernie", "albert", "bert", "roberta"):
        if arch in hint:
            return "bert" if arch == "roberta" else arch
    raise MRCError(f"{path}/config.json: cannot tell the architecture (model_type/architectures: {hint or 'none'})")


def hub_reachable(hub_name: str) -> tuple[bool, str]:
    if os.environ.get("MRC_OFFLINE", "0") == "1":
        return False, "MRC_OFFLINE=1"
    from paddlenlp.transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(hub_name)
        return True, ""
    except Exception as err:  # offline: OSError from the download attempt
        return False, f"hub {hub_name} unreachable ({type(err).__name__})"


def resolve_backbone(name_or_dir: str, profile: str = "cpu", outputs_dir="outputs", vocab_dir=None,
                     size: str | None = None, own_pretrain: bool = True) -> BackboneSpec:
    """Hub name / local dir / configs/models/<name>.yaml -> where the weights come from. Offline order:
    hub, the project's own pre-training (unless own_pretrain=False), random init at offline size `size`
    (default: the profile's) from configs/models/offline_sizes.yaml."""
    name = str(name_or_dir)
    path = Path(name)
    if path.exists() or name.startswith((".", "/", "~")):
        if not path.is_dir():
            raise MRCError(f"{name}: checkpoint directory not found")
        if not has_weights(path):
            raise MRCError(f"{name}: checkpoint directory has no config.json + model weights ({', '.join(WEIGHT_FILES)})")
        return BackboneSpec(name, "local", arch_of_dir(path), str(path), str(path), reason="local directory")
    outputs_dir = Path(outputs_dir)
    if not outputs_dir.is_absolute():
        outputs_dir = REPO_ROOT / outputs_dir
    spec_file = MODELS_DIR / f"{name}.yaml"
    if not spec_file.exists():
        ok, why = hub_reachable(name)
        if ok:
            from paddlenlp.transformers import AutoConfig

            arch = arch_of_config(AutoConfig.from_pretrained(name))
            return BackboneSpec(name, "hub", arch, name, name, reason="hub name")
        raise MRCError(f"unknown model '{name}': not a directory, not one of {', '.join(known_models())} "
                       f"(configs/models/), and not loadable from the hub ({why})")
    spec = load_yaml_config(spec_file)
    hub, arch, recipe = spec.get("hub"), spec["arch"], spec.get("recipe", name)
    reasons = []
    if hub:
        ok, why = hub_reachable(hub)
        if ok:
            return BackboneSpec(name, "hub", arch, hub, hub, reason=f"hub {hub}")
        reasons.append(why)
    own = outputs_dir / "pretrain" / recipe
    if not own_pretrain:
        reasons.append("own pre-training not used (own_pretrain false)")
    elif has_weights(own):
        found_arch = arch_of_dir(own)
        if found_arch != arch:
            raise MRCError(f"{own}: holds a {found_arch} model but configs/models/{name}.yaml wants {arch}")
        return BackboneSpec(name, "pretrained", arch, str(own), str(own), reason="; ".join(reasons + [f"own pre-training {own}"]))
    else:
        reasons.append(f"no pre-trained checkpoint in {own}")
    vocab_dir = Path(vocab_dir) if vocab_dir else outputs_dir / "vocab"
    size = size or profile
    return BackboneSpec(name, "random", arch, str(vocab_dir), str(vocab_dir), config=offline_sizes(size),
                        reason="; ".join(reasons) + f"; random init, offline size '{size}'")


def arch_of_config(config) -> str:
    hint = (getattr(config, "model_type", "") or type(config).__name__).lower()
    for arch in ("ernie", "albert", "bert", "roberta"):
        if arch in hint:
            return "bert" if arch == "roberta" else arch
    raise MRCError(f"unsupported architecture {hint}: bert, ernie, albert families are supported")


def load_tokenizer_for(spec: BackboneSpec, data_dir=None):
    from .vocab import ensure_project_vocab, load_tokenizer

    if spec.kind == "random" and not (Path(spec.tokenizer_source) / "vocab.txt").exists():
        ensure_project_vocab(spec.tokenizer_source, data_dir=data_dir)
    return load_tokenizer(spec.tokenizer_source)


def build_config(spec: BackboneSpec, tokenizer, **overrides):
    classes = arch_classes(spec.arch)
    sizes = {**spec.config, **overrides}
    return classes.config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **sizes)


def load_encoder(spec: BackboneSpec, data_dir=None, dropout: float | None = None):
    """(paddlenlp encoder, tokenizer) for a resolved spec; logs exactly which weights were loaded.
    `dropout` (None: the config's own) sets the encoder's hidden and attention dropout."""
    classes = arch_classes(spec.arch)
    tokenizer = load_tokenizer_for(spec, data_dir)
    rates = {} if dropout is None else {"hidden_dropout_prob": float(dropout), "attention_probs_dropout_prob": float(dropout)}
    if spec.kind == "random":
        model = classes.model(build_config(spec, tokenizer, **rates))
    elif rates:
        config = classes.config.from_pretrained(spec.source)
        for key, value in rates.items():
            setattr(config, key, value)
        model = classes.model.from_pretrained(spec.source, config=config)
    else:
        model = classes.model.from_pretrained(spec.source)
    log.info(spec.describe() + (f"; dropout {dropout:g}" if rates else ""))
    return model, tokenizer
