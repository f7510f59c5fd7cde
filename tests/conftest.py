"""Shared fixtures: the real default model, tiny random HF model directories that reuse its tokenizer,
and the telemetry back-ends (Prometheus, Phoenix) that the telemetry and API tests run against."""

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import yaml

if not torch.cuda.is_available():
    # Triton runs under its interpreter without a GPU, and takes the setting when it is first
    # imported: set here, before any test module or a library one imports (transformers' Qwen3-VL
    # video processor loads triton) does so.
    os.environ.setdefault("TRITON_INTERPRET", "1")

from spyglass.core.engine.engine import LLMEngine
from spyglass.core.engine.runner.cuda_graphs import CudaGraphDecoder, GraphShape
from spyglass.core.loaders.checkpoint import Checkpoint
from spyglass.core.loaders.default_model import default_model_override, ensure_default_model
from spyglass.core.loaders.gguf_loader import load_gguf

# Small enough to build and save in well under a second, with GQA (4 query heads share 2 kv heads).
TINY_SHAPE = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
)


@pytest.fixture(scope="module", autouse=True)
def denormals_restored():
    """An engine built in this process flushes denormals on its thread, the tests' (`LLMEngine`):
    each module leaves them restored, since hypothesis' float strategies (the fuzz test's, the
    property tests') refuse to run with them flushed."""
    yield
    torch.set_flush_denormal(False)


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """The default model's GGUF file (downloaded into the user cache on first use)."""
    return ensure_default_model()


@pytest.fixture(scope="session")
def default_checkpoint(default_model_path) -> Checkpoint:
    """The default model loaded in float32 (shared: each load takes seconds)."""
    return load_gguf(default_model_path, torch.float32)


@pytest.fixture(scope="session")
def hf_gguf_tokenizer():
    """transformers' own tokenizer for the default GGUF: the reference our tokenizer must match.
    Where ``$SPYGLASS_DEFAULT_MODEL`` names a model directory (`examples/gpu_check.py`'s random
    default shape on a machine without the GGUF), that directory's copy of the same tokenizer."""
    from transformers import AutoTokenizer

    override = default_model_override()
    if override is not None and override.is_dir():
        return AutoTokenizer.from_pretrained(override)
    path = ensure_default_model()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _with_wide_weights(model):
    """``model`` with every weight but the norms' drawn at std 0.1 (biases too): wider than
    transformers' init, so that masks, windows and caps show in the outputs."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.endswith("norm.weight"):
                param.normal_(std=0.1)
    return model


def _save_tiny(model, tokenizer, path: Path, **save_kwargs) -> Path:
    model.save_pretrained(path, **save_kwargs)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, hf_gguf_tokenizer) -> Path:
    """A random 2-layer LlamaForCausalLM (untied, llama3 rope scaling) saved with the default model's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        **TINY_SHAPE,
        vocab_size=len(hf_gguf_tokenizer),
        max_position_embeddings=16384,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
    )
    return _save_tiny(
        LlamaForCausalLM(config), hf_gguf_tokenizer, tmp_path_factory.mktemp("tiny_llama")
    )


@pytest.fixture(scope="session")
def tiny_fim_dir(tmp_path_factory, tiny_llama_dir) -> Path:
    """`tiny_llama_dir` with StarCoder's fill-in-the-middle tokens: the default tokenizer's unused
    special tokens 8 to 10 (``<issue_start>`` ...) renamed ``<fim_prefix>``, ``<fim_suffix>`` and
    ``<fim_middle>``, as a code model's vocabulary has them; the weights are the same files."""
    path = tmp_path_factory.mktemp("tiny_fim")
    renamed = ("tokenizer.json", "tokenizer_config.json")
    for item in tiny_llama_dir.iterdir():
        if item.name not in renamed:
            (path / item.name).symlink_to(item)
    for name in renamed:
        text = (tiny_llama_dir / name).read_text()
        for old, new in zip(FIM_RENAMED, ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")):
            text = text.replace(json.dumps(old), json.dumps(new))
        (path / name).write_text(text)
    return path


FIM_RENAMED = ("<issue_start>", "<issue_comment>", "<issue_closed>")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory, hf_gguf_tokenizer) -> Path:
    """A random 2-layer Qwen2ForCausalLM (q/k/v biases, tied embeddings, two eos ids), saved in several shards."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    config = Qwen2Config(
        **TINY_SHAPE,
        vocab_size=len(hf_gguf_tokenizer),
        tie_word_embeddings=True,
        eos_token_id=[2, 0],
    )
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        # transformers initializes biases to zero, which would make a bias mix-up invisible.
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.normal_()
    return _save_tiny(
        model, hf_gguf_tokenizer, tmp_path_factory.mktemp("tiny_qwen2"), max_shard_size="5MB"
    )


@pytest.fixture(scope="session")
def tiny_pooling_model_dir(tmp_path_factory, hf_gguf_tokenizer):
    """``make(config_class, model_class, **config)``: a random 2-layer model that pools rather
    than generates, saved once with the default model's tokenizer: a base model (no head,
    parameters named without ``model.``, as embedding models such as e5-mistral and gte-Qwen2
    ship), e.g. ``make("MistralConfig", "MistralModel")``, or a sequence classifier, e.g.
    ``make("LlamaConfig", "LlamaForSequenceClassification", num_labels=3)``. Weights are drawn
    at std 0.1, biases too."""
    import transformers

    built: dict[str, Path] = {}

    def make(config_class: str, model_class: str, **options) -> Path:
        key = json.dumps([model_class, options], sort_keys=True)
        if key not in built:
            torch.manual_seed(20 + len(built))
            config = getattr(transformers, config_class)(
                **TINY_SHAPE,
                vocab_size=len(hf_gguf_tokenizer),
                bos_token_id=1,
                eos_token_id=2,
                **options,
            )
            model = _with_wide_weights(getattr(transformers, model_class)(config))
            built[key] = _save_tiny(
                model, hf_gguf_tokenizer, tmp_path_factory.mktemp(f"tiny_{model_class}")
            )
        return built[key]

    return make


# -- telemetry back-ends: Prometheus and Phoenix on loopback, started by the tests that need them --

SERVICES = Path(__file__).resolve().parent / "services"


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _require_tool(name: str) -> None:
    if shutil.which(name) is None:
        message = f"{name} is not installed (apt-get install prometheus / nodejs npm)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture
def require_tool():
    """``require_tool(name)``: skip without the tool on a developer machine; in CI (CI set) fail instead."""
    return _require_tool


@dataclass
class Prometheus:
    """A running Prometheus: its HTTP API, and a wait for scrapes."""

    base_url: str

    def api(self, path: str, **params) -> dict:
        """GET ``path`` with ``params``; the JSON answer, errors included."""
        url = f"{self.base_url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            return json.load(error)

    def wait_for_scrapes(self, count: int, timeout: float = 60) -> None:
        """Return once the target has been scraped ``count`` times with success (within the last
        minute): a scrape that fails (the exposition slower than the 1 s interval, in a busy
        test process) records ``up`` 0 and no samples."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = self.api("/api/v1/query", query="sum_over_time(up[1m])")["data"]["result"]
            if result and float(result[0]["value"][1]) >= count:
                return
            time.sleep(0.3)
        raise AssertionError(f"Prometheus did not scrape {count} times")


def _ready(base_url: str) -> bool:
    try:
        return urllib.request.urlopen(f"{base_url}/-/ready", timeout=1).status == 200
    except OSError:
        return False


@pytest.fixture
def start_prometheus(tmp_path, require_tool):
    """``start_prometheus("host:port")`` -> `Prometheus` scraping that target every second (job spyglass).

    Exemplar storage is on; every Prometheus started is stopped after the test.
    """
    require_tool("prometheus")
    processes = []

    def start(target: str) -> Prometheus:
        index = len(processes)
        config = {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [{"job_name": "spyglass", "static_configs": [{"targets": [target]}]}],
        }
        config_path = tmp_path / f"prometheus-{index}.yml"
        config_path.write_text(yaml.safe_dump(config))
        log_path = tmp_path / f"prometheus-{index}.log"
        port = free_port()
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [
                    "prometheus",
                    f"--config.file={config_path}",
                    f"--web.listen-address=127.0.0.1:{port}",
                    f"--storage.tsdb.path={tmp_path / f'data-{index}'}",
                    "--enable-feature=exemplar-storage",
                ],
                stdout=log,
                stderr=log,
            )
        processes.append(process)
        base_url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while not _ready(base_url):
            assert process.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        return Prometheus(base_url)

    yield start
    for process in processes:
        process.terminate()
        process.wait(timeout=20)


def _flatten(attributes: dict, prefix: str = "") -> dict:
    flat = {}
    for key, value in attributes.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


@dataclass
class Phoenix:
    """A running Phoenix: its URL, its OTLP endpoints, and the spans it stored."""

    base_url: str
    http_traces: str
    grpc: str

    def spans(self, project: str, expected: int, timeout: float = 60) -> list[dict]:
        """The project's spans once at least ``expected`` have arrived; attribute names flat (Phoenix nests them)."""
        deadline = time.monotonic() + timeout
        spans: list[dict] = []
        while time.monotonic() < deadline:
            try:
                url = f"{self.base_url}/v1/projects/{project}/spans?limit=1000"
                with urllib.request.urlopen(url, timeout=10) as response:
                    spans = json.load(response)["data"]
            except urllib.error.HTTPError as error:
                if error.code != 404:  # the project appears with its first span
                    raise
            if len(spans) >= expected:
                return [{**span, "attributes": _flatten(span["attributes"])} for span in spans]
            time.sleep(0.5)
        raise AssertionError(f"Phoenix has {len(spans)} spans in {project!r}, expected {expected}")


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory):
    """A `Phoenix` server on loopback (tests/services/start_phoenix.sh).

    Set SPYGLASS_SKIP_PHOENIX=1 to skip the tests that need it (the install takes minutes).
    """
    if os.environ.get("SPYGLASS_SKIP_PHOENIX") == "1":
        pytest.skip("SPYGLASS_SKIP_PHOENIX=1: Phoenix end-to-end tests skipped on request")
    http_port, grpc_port = free_port(), free_port()
    env = dict(os.environ, PHOENIX_PORT=str(http_port), PHOENIX_GRPC_PORT=str(grpc_port))
    env.pop("PHOENIX_WORKING_DIR", None)
    log_path = tmp_path_factory.mktemp("phoenix") / "phoenix.log"
    log_file = log_path.open("wb")
    process = subprocess.Popen(
        ["bash", str(SERVICES / "start_phoenix.sh")], env=env, stdout=log_file, stderr=log_file
    )
    base_url = f"http://127.0.0.1:{http_port}"
    deadline = time.monotonic() + 900  # the first run installs Phoenix
    while True:
        try:
            urllib.request.urlopen(f"{base_url}/healthz", timeout=2)
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                output = log_path.read_text(errors="replace")[-4000:]
                pytest.fail(f"Phoenix did not start (exit code {process.poll()}):\n{output}")
            time.sleep(0.5)
    yield Phoenix(base_url, f"{base_url}/v1/traces", f"http://127.0.0.1:{grpc_port}")
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
    log_file.close()


# Family -> (transformers config class, model class, config options beyond TINY_SHAPE). Every
# option below is one the family's real checkpoints use, shrunk: a 16-token sliding window (the
# test prompts run past it), rope scalings, soft-caps small enough to bite on random weights.
_WINDOW = 16
TINY_FAMILIES = {
    "qwen2-yarn": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        ),
    ),
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(
            head_dim=16,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 1000000.0,
                "factor": 2.0,
                "original_max_position_embeddings": 128,
            },
        ),
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=_WINDOW)),
    "phi3": (
        "Phi3Config",
        "Phi3ForCausalLM",
        dict(
            pad_token_id=0,
            max_position_embeddings=1024,
            original_max_position_embeddings=256,
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "short_factor": [1.0 + i / 8 for i in range(8)],
                "long_factor": [2.0 + i for i in range(8)],
            },
        ),
    ),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        dict(
            head_dim=16,
            sliding_window=_WINDOW,
            query_pre_attn_scalar=16,
            attn_logit_softcapping=1.0,
            final_logit_softcapping=2.0,
        ),
    ),
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            head_dim=16,
            sliding_window=_WINDOW,
            layer_types=["sliding_attention", "full_attention"],
            query_pre_attn_scalar=16,  # = head_dim, as in every Gemma 3 but the 27B (which llama.cpp assumes)
            rope_parameters={
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            },
        ),
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        dict(num_local_experts=4, num_experts_per_tok=2),
    ),
    "qwen2-moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        dict(
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
        ),
    ),
    "qwen3-moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(
            head_dim=16,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
            mlp_only_layers=[1],
        ),
    ),
    # Every layer sparse: what llama.cpp's qwen3moe architecture can express (the GGUF test's case).
    "qwen3-moe-sparse": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(
            head_dim=16,
            num_experts=8,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            norm_topk_prob=True,
        ),
    ),
}


@pytest.fixture(scope="session")
def tiny_family_dir(tmp_path_factory, hf_gguf_tokenizer):
    """``make(family)``: a random 2-layer checkpoint of a `TINY_FAMILIES` family, built once and saved with
    the default model's tokenizer. Weights are drawn wider than transformers' init (std 0.1, biases
    too) so attention is peaked enough for masks, windows and caps to show in the logits."""
    import transformers

    built: dict[str, Path] = {}

    def make(family: str) -> Path:
        if family not in built:
            config_class, model_class, options = TINY_FAMILIES[family]
            # Seeded by family, so every test selection builds the same weights.
            torch.manual_seed(10 + list(TINY_FAMILIES).index(family))
            config = getattr(transformers, config_class)(
                **TINY_SHAPE,
                vocab_size=len(hf_gguf_tokenizer),
                **options,
                bos_token_id=1,
                eos_token_id=2,
            )
            model = _with_wide_weights(getattr(transformers, model_class)(config))
            built[family] = _save_tiny(
                model, hf_gguf_tokenizer, tmp_path_factory.mktemp(f"tiny_{family}")
            )
        return built[family]

    return make


@pytest.fixture(scope="session")
def make_lora_adapter(tmp_path_factory):
    """``make(base_dir, target_modules, seed=0, **lora_config)``: a PEFT LoRA adapter for the model
    in ``base_dir``, saved by PEFT (rank 8, alpha 16 unless ``lora_config`` says otherwise) with
    every LoRA weight drawn at std 0.1, so that its delta shows in the logits; built once per set
    of arguments."""
    import peft
    from transformers import AutoModelForCausalLM

    built: dict[str, Path] = {}

    def make(base_dir: Path, target_modules, seed: int = 0, **lora_config) -> Path:
        key = json.dumps([str(base_dir), list(target_modules), seed, lora_config], sort_keys=True)
        if key not in built:
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
            options = {"r": 8, "lora_alpha": 16, **lora_config}
            config = peft.LoraConfig(
                target_modules=list(target_modules), init_lora_weights=False, **options
            )
            adapted = peft.get_peft_model(model, config)
            with torch.no_grad():
                for name, param in adapted.named_parameters():
                    if "lora_" in name:
                        param.normal_(std=0.1)
            path = tmp_path_factory.mktemp("lora_adapter")
            adapted.save_pretrained(path)
            built[key] = path
        return built[key]

    return make


@pytest.fixture(scope="session")
def hf_beams(tiny_llama_dir):
    """``beams(token_ids, width, length)``: transformers' beam search on the tiny model, best first."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32)

    def beams(token_ids: list[int], width: int, length: int) -> list[list[int]]:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([token_ids]),
                num_beams=width,
                num_return_sequences=width,
                max_new_tokens=length,
                min_new_tokens=length,
                do_sample=False,
            )
        return [row[len(token_ids) :].tolist() for row in out]

    return beams


# A 3-layer vision tower on 32-pixel images in 8-pixel patches (16 of them): the tiny LLaVAs'.
TINY_TOWER = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    image_size=32,
    patch_size=8,
)


# A chat template that reads content parts and writes an image's placeholder, as llava-hf's does.
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'].upper() }}: "
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '<image>\\n' }}"
    "{% elif part['type'] == 'video' %}{{ '<video>\\n' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{{ '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


@pytest.fixture(scope="session")
def make_tiny_llava(tmp_path_factory, hf_gguf_tokenizer):
    """``make(tower)``: a random LlavaForConditionalGeneration, built once per tower, with the
    default model's tokenizer plus an ``<image>`` token and a chat template that reads content
    parts. ``clip``: a 3-layer CLIP tower on 32-pixel images in 8-pixel patches (16 image tokens,
    the class token dropped) before a 2-layer Llama; a CLIP image processor's config (shortest
    edge resized to 40, centre cut to 32). ``siglip``: a 3-layer SigLIP tower (16 tokens, all
    kept, read at its last layer) before a 2-layer Qwen2; a SigLIP processor (a square resize).
    ``next`` and ``onevision``: LLaVA-NeXT and LLaVA-OneVision (`_tiny_llava_grid`)."""
    import copy

    import transformers
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    built: dict[str, Path] = {}

    def make(tower: str) -> Path:
        if tower in built:
            return built[tower]
        tokenizer = copy.deepcopy(hf_gguf_tokenizer)
        tokenizer.add_tokens(["<image>"], special_tokens=True)
        tokenizer.chat_template = LLAVA_CHAT_TEMPLATE
        torch.manual_seed(7)
        if tower in ("next", "onevision"):
            path = tmp_path_factory.mktemp(f"tiny_llava_{tower}")
            built[tower] = _tiny_llava_grid(tokenizer, path, tower == "onevision")
            return built[tower]
        clip = tower == "clip"
        text = getattr(transformers, "LlamaConfig" if clip else "Qwen2Config")(
            **TINY_SHAPE, vocab_size=len(tokenizer), bos_token_id=1, eos_token_id=2
        )
        vision = getattr(transformers, "CLIPVisionConfig" if clip else "SiglipVisionConfig")(
            **TINY_TOWER
        )
        config = LlavaConfig(
            vision_config=vision,
            text_config=text,
            image_token_index=len(tokenizer) - 1,
            image_seq_length=16,
            vision_feature_layer=-2 if clip else -1,
            vision_feature_select_strategy="default" if clip else "full",
        )
        path = _save_tiny(
            _with_wide_weights(LlavaForConditionalGeneration(config)),
            tokenizer,
            tmp_path_factory.mktemp(f"tiny_llava_{tower}"),
        )
        if clip:
            processor = transformers.CLIPImageProcessorPil(size={"shortest_edge": 40}, crop_size=32)
        else:
            processor = transformers.SiglipImageProcessorPil(size={"height": 32, "width": 32})
        processor.save_pretrained(path)
        built[tower] = path
        return path

    return make


# Idefics3's tower on 24-pixel tiles of 4-pixel patches (6 a side: 1/6 is no exact float, so
# transformers' position buckets are put to the test), 3 x 3 patches shuffled into a token:
# 4 tokens a tile.
TINY_TILED_TOWER = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    image_size=24,
    patch_size=4,
)

# SmolVLM's chat template (content parts; an image part is its placeholder).
SMOLVLM_CHAT_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)


@pytest.fixture(scope="session")
def make_tiny_idefics3(tmp_path_factory, hf_gguf_tokenizer):
    """``make(architecture, split=True)``: a random ``Idefics3ForConditionalGeneration`` or
    ``SmolVLMForConditionalGeneration`` (`TINY_TILED_TOWER`, pixel shuffle by 3, before a 2-layer
    Llama), built once per argument pair, saved with its processor (longest edge resized to 60,
    24-pixel tiles: at most 3 x 3 of them, splitting as ``split`` says) and the default model's
    tokenizer plus Idefics3's image, tile and row/column tokens and SmolVLM's chat template."""
    import copy

    import transformers

    built: dict[tuple[str, bool], Path] = {}

    def make(architecture: str = "Idefics3", split: bool = True) -> Path:
        if (architecture, split) in built:
            return built[architecture, split]
        tokenizer = copy.deepcopy(hf_gguf_tokenizer)
        tiles = [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
        tokenizer.add_tokens(
            ["<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", *tiles],
            special_tokens=True,
        )
        tokenizer.chat_template = SMOLVLM_CHAT_TEMPLATE
        torch.manual_seed(11)
        text = transformers.LlamaConfig(
            **TINY_SHAPE, vocab_size=len(tokenizer), bos_token_id=1, eos_token_id=2
        )
        vision = getattr(transformers, f"{architecture}VisionConfig")(**TINY_TILED_TOWER)
        config = getattr(transformers, f"{architecture}Config")(
            vision_config=vision,
            text_config=text,
            scale_factor=3,
            image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        )
        model = getattr(transformers, f"{architecture}ForConditionalGeneration")(config)
        path = tmp_path_factory.mktemp(f"tiny_{architecture.lower()}_{split}")
        model = _with_wide_weights(model)
        model.save_pretrained(path)
        image_processor = getattr(transformers, f"{architecture}ImageProcessorPil")(
            size={"longest_edge": 60},
            max_image_size={"longest_edge": 24},
            do_image_splitting=split,
        )
        if architecture == "SmolVLM":
            # As the Hub's SmolVLM checkpoints ship it: preprocessor_config.json and the
            # tokenizer (transformers' SmolVLMProcessor wants a video processor, torchvision's).
            image_processor.save_pretrained(path)
            tokenizer.save_pretrained(path)
        else:
            transformers.Idefics3Processor(
                image_processor, tokenizer, image_seq_len=4
            ).save_pretrained(path)
        built[architecture, split] = path
        return path

    return make


@pytest.fixture(scope="session")
def tiny_idefics3_dir(make_tiny_idefics3) -> Path:
    """The splitting tiny Idefics3 of `make_tiny_idefics3`."""
    return make_tiny_idefics3("Idefics3")


# LLaVA-NeXT's grid resolutions (height, width) for 32-pixel tiles, as llava-v1.6's are for 336;
# LLaVA-OneVision's: every grid up to 3 x 3.
TINY_PINPOINTS = [[32, 64], [64, 32], [64, 64], [96, 32], [32, 96]]
TINY_ONEVISION_PINPOINTS = [[32 * r, 32 * c] for r in range(1, 4) for c in range(1, 4)]


def _tiny_llava_grid(tokenizer, path: Path, onevision: bool) -> Path:
    """A random LlavaNextForConditionalGeneration (the CLIP tower of `TINY_TOWER`, 16 tokens a
    tile, before a 2-layer Llama, `TINY_PINPOINTS`) or, with ``onevision``, a
    LlavaOnevisionForConditionalGeneration (its SigLIP tower, every patch, before a 2-layer
    Qwen2; `TINY_ONEVISION_PINPOINTS`; grids shrunk past 2 tiles' worth: ``anyres_max_2``; a
    ``<video>`` token after ``<image>``), saved as llava-hf's checkpoints are
    (preprocessor_config.json and the tokenizer)."""
    import transformers

    image_token = len(tokenizer) - 1
    extra = {}
    if onevision:  # and its videos
        tokenizer.add_tokens(["<video>"], special_tokens=True)
        extra = {"vision_aspect_ratio": "anyres_max_2", "video_token_index": len(tokenizer) - 1}
    text = getattr(transformers, "Qwen2Config" if onevision else "LlamaConfig")(
        **TINY_SHAPE, vocab_size=len(tokenizer), bos_token_id=1, eos_token_id=2
    )
    tower = getattr(transformers, "SiglipVisionConfig" if onevision else "CLIPVisionConfig")
    kind = "Onevision" if onevision else "Next"
    pinpoints = TINY_ONEVISION_PINPOINTS if onevision else TINY_PINPOINTS
    config = getattr(transformers, f"Llava{kind}Config")(
        vision_config=tower(**TINY_TOWER),
        text_config=text,
        image_token_index=image_token,
        image_grid_pinpoints=pinpoints,
        **extra,
    )
    model_class = getattr(transformers, f"Llava{kind}ForConditionalGeneration")
    _save_tiny(_with_wide_weights(model_class(config)), tokenizer, path)
    size = {"height": 32, "width": 32} if onevision else {"shortest_edge": 32}
    crop = {} if onevision else {"crop_size": 32}
    getattr(transformers, f"Llava{kind}ImageProcessorPil")(
        size=size, image_grid_pinpoints=pinpoints, **crop
    ).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_onevision_dir(make_tiny_llava) -> Path:
    """The tiny LLaVA-OneVision of `make_tiny_llava`."""
    return make_tiny_llava("onevision")


@pytest.fixture(scope="session")
def tiny_llava_next_dir(make_tiny_llava) -> Path:
    """The tiny LLaVA-NeXT of `make_tiny_llava`."""
    return make_tiny_llava("next")


@pytest.fixture(scope="session")
def tiny_llava_dir(make_tiny_llava) -> Path:
    """The CLIP-tower tiny LLaVA of `make_tiny_llava`."""
    return make_tiny_llava("clip")


# Qwen2-VL's chat template, cut to what the tests render: an image part is its placeholder
# between the vision start and end tokens.
QWEN_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'video' %}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen2-VL's towers on 4-pixel patches merged 2 x 2, images resized to between 16 x 16 and
# 48 x 48 pixels (1 to 36 tokens); Qwen2.5-VL's windows are 2 x 2 tokens, its second layer
# attends to the whole image.
TINY_QWEN_PATCHES = dict(patch_size=4, spatial_merge_size=2, temporal_patch_size=2)
TINY_QWEN_TOWERS = {
    "Qwen2VL": dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, **TINY_QWEN_PATCHES),
    "Qwen2_5_VL": dict(
        depth=3,
        hidden_size=32,
        intermediate_size=48,
        out_hidden_size=64,
        num_heads=2,
        window_size=16,
        fullatt_block_indexes=[1],
        **TINY_QWEN_PATCHES,
    ),
    "Qwen3VL": dict(
        depth=3,
        hidden_size=32,
        intermediate_size=48,
        out_hidden_size=64,
        num_heads=2,
        num_position_embeddings=16,
        deepstack_visual_indexes=[0, 1],
        **TINY_QWEN_PATCHES,
    ),
}


# Qwen3-VL's video processor on the tiny tower: its frames together between 512 and 13,824
# pixels (6 frames of 48 x 48), at 2 a second (4 to 24 of them), normalized as its images are.
TINY_QWEN3_VIDEO = dict(
    size={"shortest_edge": 512, "longest_edge": 6 * 48 * 48},
    min_frames=4,
    max_frames=24,
    image_mean=[0.48145466, 0.4578275, 0.40821073],
    image_std=[0.26862954, 0.26130258, 0.27577711],
    **{key: TINY_QWEN_PATCHES[key] for key in ("patch_size", "temporal_patch_size")},
    merge_size=TINY_QWEN_PATCHES["spatial_merge_size"],
)


@pytest.fixture(scope="session")
def make_tiny_qwen2_vl(tmp_path_factory, hf_gguf_tokenizer):
    """``make(architecture)``: a random ``Qwen2VLForConditionalGeneration`` (``"Qwen2VL"``),
    ``Qwen2_5_VLForConditionalGeneration`` (``"Qwen2_5_VL"``) or ``Qwen3VLForConditionalGeneration``
    (``"Qwen3VL"``: learned position embeddings on a 4 x 4 grid, DeepStack after the tower's first
    two layers), built once each: a tower of `TINY_QWEN_TOWERS` before a 2-layer Qwen2 (Qwen3-VL:
    Qwen3, M-RoPE interleaved) whose M-RoPE sections are 2, 3 and 3 frequencies,
    saved as transformers 5 saves it, with its image processor's preprocessor_config.json
    (`TINY_QWEN_PATCHES`; 256 to 2304 pixels; Qwen3-VL's video processor's too,
    `TINY_QWEN3_VIDEO`) and the default model's tokenizer plus the vision tokens and
    `QWEN_VL_CHAT_TEMPLATE`."""
    import copy

    import transformers

    built: dict[str, Path] = {}

    def make(architecture: str = "Qwen2VL") -> Path:
        if architecture in built:
            return built[architecture]
        tokenizer = copy.deepcopy(hf_gguf_tokenizer)
        tokenizer.add_tokens(
            ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"],
            special_tokens=True,
        )
        tokenizer.chat_template = QWEN_VL_CHAT_TEMPLATE
        torch.manual_seed(13)
        text = dict(
            **TINY_SHAPE,
            vocab_size=len(tokenizer),
            bos_token_id=1,
            eos_token_id=2,
            rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e4},
        )
        if architecture == "Qwen3VL":
            text["head_dim"] = 16
            text["rope_parameters"]["mrope_interleaved"] = True
        ids = tokenizer.convert_tokens_to_ids
        config = getattr(transformers, f"{architecture}Config")(
            text_config=text,
            vision_config=TINY_QWEN_TOWERS[architecture],
            image_token_id=ids("<|image_pad|>"),
            video_token_id=ids("<|video_pad|>"),
            vision_start_token_id=ids("<|vision_start|>"),
            vision_end_token_id=ids("<|vision_end|>"),
        )
        model = getattr(transformers, f"{architecture}ForConditionalGeneration")(config)
        path = _save_tiny(
            _with_wide_weights(model), tokenizer, tmp_path_factory.mktemp(f"tiny_{architecture}")
        )
        image_processor = transformers.Qwen2VLImageProcessorPil(
            min_pixels=256, max_pixels=2304, patch_size=4, merge_size=2
        )
        image_processor.save_pretrained(path)
        if architecture == "Qwen3VL":
            # The module's class: transformers' top-level one wants torchvision.
            from transformers.models.qwen3_vl.video_processing_qwen3_vl import (
                Qwen3VLVideoProcessor,
            )

            Qwen3VLVideoProcessor(**TINY_QWEN3_VIDEO).save_pretrained(path)
        built[architecture] = path
        return path

    return make


@pytest.fixture(scope="session")
def tiny_qwen2_5_vl_dir(make_tiny_qwen2_vl) -> Path:
    """The tiny Qwen2.5-VL of `make_tiny_qwen2_vl`."""
    return make_tiny_qwen2_vl("Qwen2_5_VL")


# A Gemma 3 chat template that reads content parts, as google's does (no system turn here).
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)
GEMMA3_IMAGE_TOKENS = ["<start_of_image>", "<end_of_image>", "<image_soft_token>"]


@pytest.fixture(scope="session")
def tiny_gemma3_vision_dir(tmp_path_factory, hf_gguf_tokenizer) -> Path:
    """A random ``Gemma3ForConditionalGeneration``: SigLIP's tower (2 layers, 32-pixel images in
    4-pixel patches) pooled 2 x 2 into 16 image tokens, before a 2-layer Gemma 3 whose first
    layer slides over 12 positions (less than an image); saved as transformers saves it, with
    its image processor and the default model's tokenizer plus the image and turn tokens and
    `GEMMA3_CHAT_TEMPLATE`."""
    import copy

    import transformers

    tokenizer = copy.deepcopy(hf_gguf_tokenizer)
    tokenizer.add_tokens(
        [*GEMMA3_IMAGE_TOKENS, "<start_of_turn>", "<end_of_turn>"], special_tokens=True
    )
    tokenizer.chat_template = GEMMA3_CHAT_TEMPLATE
    ids = tokenizer.convert_tokens_to_ids
    torch.manual_seed(17)
    text = dict(
        **TINY_SHAPE,
        head_dim=16,
        vocab_size=len(tokenizer),
        sliding_window=12,
        layer_types=["sliding_attention", "full_attention"],
        query_pre_attn_scalar=16,
        bos_token_id=1,
        eos_token_id=2,
    )
    tower = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=32,
        patch_size=4,
        vision_use_head=False,
    )
    config = transformers.Gemma3Config(
        text_config=text,
        vision_config=tower,
        mm_tokens_per_image=16,
        boi_token_index=ids("<start_of_image>"),
        eoi_token_index=ids("<end_of_image>"),
        image_token_index=ids("<image_soft_token>"),
    )
    model = transformers.Gemma3ForConditionalGeneration(config)
    path = _save_tiny(
        _with_wide_weights(model), tokenizer, tmp_path_factory.mktemp("tiny_gemma3_vision")
    )
    transformers.Gemma3ImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(path)
    return path


# A Mistral-style chat template that reads content parts and writes [IMG] for an image.
MISTRAL3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}[INST]"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '[IMG]' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "[/INST]{% else %}{{ message['content'] }}{{ eos_token }}{% endif %}{% endfor %}"
)


@pytest.fixture(scope="session")
def tiny_mistral3_dir(tmp_path_factory, hf_gguf_tokenizer) -> Path:
    """A random ``Mistral3ForConditionalGeneration``: Pixtral's tower (2 layers, 4-pixel patches,
    SiLU-gated MLPs) whose patches are merged 2 x 2, before a 2-layer Mistral; images scaled to
    at most 64 pixels a side and rounded up to 8-pixel merged patches. Saved as transformers
    saves it, with its image processor and the default model's tokenizer plus the image tokens
    and `MISTRAL3_CHAT_TEMPLATE`."""
    import copy

    import transformers

    tokenizer = copy.deepcopy(hf_gguf_tokenizer)
    tokenizer.add_tokens(
        ["[IMG]", "[IMG_BREAK]", "[IMG_END]", "[INST]", "[/INST]"], special_tokens=True
    )
    tokenizer.chat_template = MISTRAL3_CHAT_TEMPLATE
    torch.manual_seed(19)
    text = dict(
        **TINY_SHAPE,
        model_type="mistral",
        head_dim=16,
        vocab_size=len(tokenizer),
        sliding_window=None,
        bos_token_id=1,
        eos_token_id=2,
    )
    tower = dict(
        model_type="pixtral",
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        head_dim=16,
        image_size=64,
        patch_size=4,
        hidden_act="silu",
    )
    config = transformers.Mistral3Config(
        text_config=text,
        vision_config=tower,
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=2,
        tie_word_embeddings=False,
    )
    model = transformers.Mistral3ForConditionalGeneration(config)
    path = _save_tiny(
        _with_wide_weights(model), tokenizer, tmp_path_factory.mktemp("tiny_mistral3")
    )
    transformers.PixtralImageProcessorPil(
        size={"longest_edge": 64}, patch_size={"height": 8, "width": 8}
    ).save_pretrained(path)
    return path


class EagerReplay(CudaGraphDecoder):
    """CUDA graphs' padding and row mapping on the CPU: a replay runs the captured half of the
    model (its hidden states) eagerly; the replayed shapes and their steps' token counts are kept."""

    def __init__(self, *args):
        super().__init__(*args)
        self.replayed: list[GraphShape] = []
        self.step_tokens: list[int] = []  # each replayed step's own tokens

    def run(self, shape, input_ids, *args):
        self.step_tokens.append(len(input_ids))
        return super().run(shape, input_ids, *args)

    def _replay(self, shape):
        self.replayed.append(shape)
        return self.forward(shape)


@pytest.fixture(scope="session")
def eager_graphs() -> Callable[..., EagerReplay]:
    """``install(engine, rows_per_request=(1,), token_buckets=())``: the engine's runner replays
    `EagerReplay` graphs (batch buckets up to its ``max_num_seqs``, and packed ones of those token
    counts) wherever a step fits one; returns them."""

    def install(
        engine: LLMEngine,
        rows_per_request: tuple[int, ...] = (1,),
        token_buckets: tuple[int, ...] = (),
    ) -> EagerReplay:
        runner, config = engine.runner, engine.config
        runner.graphs = EagerReplay(
            runner.model,
            runner.kv_caches,
            config.max_num_seqs,
            engine.max_model_len,
            config.block_size,
            rows_per_request,
            token_buckets,
        )
        return runner.graphs

    return install
