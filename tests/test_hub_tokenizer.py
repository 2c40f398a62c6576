"""A tokenizer from a Hub model repo: the real huggingface_hub client against the stand-in Hub.

In-process tests pass ``endpoint=`` and ``cache_dir=`` (huggingface_hub reads HF_ENDPOINT and
HF_HUB_CACHE at import, and builds its URL template from the first); HF_TOKEN it reads at each
request, so monkeypatch sets it. One test runs a fresh Python with the environment a user sets.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from hubserver import HubServer
from tokenshards.encoding.hubtokenizer import HubTokenizer, fetch_tokenizer, is_hub_repo_id
from tokenshards.errors import UserError

REPO = "TinyOrg/tiny-bpe-1.0"
TOKEN = "hf_reader_0123456789abcdef"
TOKENS = {TOKEN: "reader", "hf_other_user_token": "stranger"}
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Hello world, hello tokens!",
             "Ein kleiner Satz auf Deutsch.", "Привет, мир.", "数据集和分词器", "tabs\tand\nnewlines and émoji 🎉"] * 4
WEIGHTS = {"config.json": b'{"model_type": "llama", "vocab_size": 300}\n', "model.safetensors": b"\0" * 64,
           "README.md": b"---\nlicense: apache-2.0\n---\n# tiny\n"}


def _tokenizer_json() -> bytes:
    """A byte-level BPE trained on a few sentences, shaped as GPT-2's and Qwen's tokenizer.json are."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(SENTENCES, trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return tok.to_str().encode()


def _write(root: Path, files: dict[str, bytes]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


@pytest.fixture(scope="module")
def model_root(tmp_path_factory) -> Path:
    """A model repo: weights and config beside tokenizer.json and tokenizer_config.json."""
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "bos_token": None,
              "model_max_length": 2048, "added_tokens_decoder": {}}
    return _write(tmp_path_factory.mktemp("model"), {**WEIGHTS, "tokenizer.json": _tokenizer_json(),
                                                     "tokenizer_config.json": json.dumps(config).encode()})


@pytest.fixture(autouse=True)
def no_saved_token(monkeypatch, tmp_path):
    """Neither the environment's token nor one saved by `hf auth login` reaches these tests."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-saved-token"))


def _fetch(server: HubServer, tmp_path: Path, spec: str = REPO, **kw) -> HubTokenizer:
    return fetch_tokenizer(spec, endpoint=server.url, cache_dir=tmp_path / "hf-cache", backoff=0.01, **kw)


def _one_line(e: pytest.ExceptionInfo) -> str:
    message = str(e.value)
    assert "\n" not in message and "Traceback" not in message
    assert e.value.__cause__ is not None, "the cause is kept for --debug"
    return message


@pytest.mark.parametrize("spec", ["Qwen/Qwen3-8B", "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B@main",
                                  "org/name@0123456789abcdef0123456789abcdef01234567", "a/b@refs/pr/1", "gpt2/x_y"])
def test_repo_ids(spec):
    assert is_hub_repo_id(spec)


@pytest.mark.parametrize("spec", ["gpt2", "cl100k_base", "Qwen/Qwen3-8B/extra", "/abs/path", "./org/name", "org/",
                                  "org/name@", "-org/name", "org/name-", "org--x/name", "org/na..me", "org/name.git",
                                  "org/name@a..b", "org/na me", "vocab/tokenizer.json", "out/llama3.tiktoken",
                                  "mistral/tokenizer.model", "org/" + "n" * 97])
def test_not_repo_ids(spec):
    assert not is_hub_repo_id(spec)


def test_an_existing_local_folder_is_not_a_repo_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "Qwen" / "Qwen3-8B").mkdir(parents=True)
    assert not is_hub_repo_id("Qwen/Qwen3-8B")
    assert is_hub_repo_id("Qwen/Qwen3-4B")


def test_downloads_only_the_tokenizer_files(model_root, tmp_path):
    messages = []
    with HubServer(model_root, repo=REPO, repo_type="model") as server:
        tok = _fetch(server, tmp_path, announce=messages.append)
        assert tok == HubTokenizer(repo=REPO, revision=server.commit, folder=tok.folder,
                                   files=("tokenizer.json", "tokenizer_config.json"))
        assert sorted(Path(r.path).name for r in server.downloads()) == ["tokenizer.json", "tokenizer_config.json"]
        url = server.url
    assert tok.folder.name == server.commit and tok.source == f"{REPO}@{server.commit}"
    for name in tok.files:
        assert (tok.folder / name).read_bytes() == (model_root / name).read_bytes()
    assert sorted(p.name for p in tok.folder.iterdir()) == sorted(tok.files)
    loaded = Tokenizer.from_file(str(tok.folder / "tokenizer.json"))
    assert loaded.decode(loaded.encode("Hello world, hello tokens!").ids) == "Hello world, hello tokens!"
    assert messages == [f"fetching the tokenizer of {REPO} at {server.commit[:12]} (main) from {url}: "
                        "tokenizer.json, tokenizer_config.json"]


def test_a_second_fetch_is_served_from_the_cache(model_root, tmp_path):
    with HubServer(model_root, repo=REPO, repo_type="model") as server:
        first = _fetch(server, tmp_path)
        second = _fetch(server, tmp_path)
        assert second == first
        assert len(server.downloads()) == 2, "each file downloaded once"


def test_a_branch_resolves_to_its_commit(model_root, tmp_path):
    with HubServer(model_root, repo=REPO, repo_type="model", branches=("main", "v2.0")) as server:
        tok = _fetch(server, tmp_path, f"{REPO}@v2.0")
        assert tok.revision == server.commit and tok.folder.name == server.commit
        # The commit itself, as a manifest records it, fetches the same files again (from the cache).
        assert _fetch(server, tmp_path, tok.source) == tok
        assert {r.path.split("/resolve/")[1].split("/")[0] for r in server.downloads()} == {server.commit}, \
            "files are fetched at the resolved sha, never at a branch that may move between two requests"


def test_a_missing_revision(model_root, tmp_path):
    with HubServer(model_root, repo=REPO, repo_type="model") as server, pytest.raises(UserError) as e:
        url = server.url
        _fetch(server, tmp_path, f"{REPO}@v9")
    assert _one_line(e) == f"Hub repo {REPO} has no revision 'v9' on {url}: use a branch, tag or commit sha it has (e.g. main)"
    assert isinstance(e.value.__cause__, RevisionNotFoundError)


def test_gated_repo_needs_a_token(model_root, tmp_path, monkeypatch):
    gated = (f"Hub repo {REPO} is gated or private: accept its licence on the Hub and set HF_TOKEN "
             "(a token with read access)")
    with HubServer(model_root, repo=REPO, repo_type="model", gated=True, tokens=TOKENS,
                   granted=frozenset({"reader"})) as server:
        with pytest.raises(UserError) as e:
            _fetch(server, tmp_path)
        assert _one_line(e) == gated and isinstance(e.value.__cause__, GatedRepoError)
        assert e.value.__cause__.response.status_code == 401
        assert [r.status for r in server.requests if "/resolve/" in r.path] == [401], "a 401 is not retried"

        monkeypatch.setenv("HF_TOKEN", "hf_not_a_valid_token")
        with pytest.raises(UserError) as e:
            _fetch(server, tmp_path)
        assert _one_line(e) == gated and "hf_not_a_valid_token" not in str(e.value)

        monkeypatch.setenv("HF_TOKEN", "hf_other_user_token")  # valid, but its user never accepted the licence
        with pytest.raises(UserError) as e:
            _fetch(server, tmp_path)
        assert _one_line(e) == gated and e.value.__cause__.response.status_code == 403

        monkeypatch.setenv("HF_TOKEN", TOKEN)
        tok = _fetch(server, tmp_path)
    assert tok.files == ("tokenizer.json", "tokenizer_config.json") and tok.revision == server.commit
    assert (tok.folder / "tokenizer.json").read_bytes() == (model_root / "tokenizer.json").read_bytes()


def test_rate_limit_and_server_errors_are_retried(model_root, tmp_path):
    with HubServer(model_root, repo=REPO, repo_type="model") as server:
        server.fail(r"^/api/models/", status=429, headers={"Retry-After": "0"})
        server.fail(r"/resolve/.*/tokenizer\.json$", status=429, headers={"Retry-After": "0"})
        server.fail(r"/resolve/.*/tokenizer_config\.json$", status=503, times=2)
        tok = _fetch(server, tmp_path)
        statuses = [(r.method, r.status) for r in server.requests]
    assert statuses.count(("GET", 429)) + statuses.count(("HEAD", 429)) == 2 and statuses.count(("HEAD", 503)) == 2
    assert tok.files == ("tokenizer.json", "tokenizer_config.json")
    assert (tok.folder / "tokenizer_config.json").read_bytes() == (model_root / "tokenizer_config.json").read_bytes()


def test_a_server_that_keeps_failing(model_root, tmp_path):
    """Repo info is one plain GET in huggingface_hub (a download's HEAD it retries itself, 1-8 s apart)."""
    with HubServer(model_root, repo=REPO, repo_type="model") as server:
        server.fail(r"^/api/models/", status=500, times=100)
        with pytest.raises(UserError) as e:
            _fetch(server, tmp_path, retries=2)
        assert sum(r.status == 500 for r in server.requests) == 3, "the first try and 2 retries"
        url = server.url
    assert _one_line(e) == f"{url} kept answering HTTP 500 while fetching the tokenizer of {REPO} (tried 3 times); try again later"


def test_a_repo_without_tokenizer_files(tmp_path):
    root = _write(tmp_path / "weights-only", {**WEIGHTS, "special_tokens_map.json": b"{}"})
    with HubServer(root, repo="TinyOrg/weights-only", repo_type="model") as server, pytest.raises(UserError) as e:
        url = server.url
        _fetch(server, tmp_path, "TinyOrg/weights-only")
    assert str(e.value) == (f"Hub repo TinyOrg/weights-only@main ({server.commit[:12]}) has no tokenizer.json or "
                            f"tokenizer.model on {url} (found special_tokens_map.json); use a repo that ships "
                            "its tokenizer, e.g. the base model's")
    assert not server.downloads(), "nothing is downloaded"


def test_a_sentencepiece_model_alone_is_enough(tmp_path):
    root = _write(tmp_path / "sp", {**WEIGHTS, "tokenizer.model": b"\x0a\x05hello-not-really-a-model",
                                    "special_tokens_map.json": b'{"bos_token": "<s>"}'})
    with HubServer(root, repo="TinyOrg/sp", repo_type="model") as server:
        tok = _fetch(server, tmp_path, "TinyOrg/sp@main")
    assert tok.files == ("special_tokens_map.json", "tokenizer.model")
    assert (tok.folder / "tokenizer.model").read_bytes() == (root / "tokenizer.model").read_bytes()


def test_a_missing_repo(model_root, tmp_path):
    with HubServer(model_root, repo=REPO, repo_type="model") as server, pytest.raises(UserError) as e:
        url = server.url
        _fetch(server, tmp_path, "TinyOrg/no-such-model")
    assert _one_line(e) == (f"Hub model repo TinyOrg/no-such-model not found on {url}: check the name "
                            "(ORG/NAME, as on the Hub); if it is private, set HF_TOKEN to a token with read access to it")
    assert isinstance(e.value.__cause__, RepositoryNotFoundError)


def test_a_dataset_repo_is_not_a_model_repo(model_root, tmp_path):
    with HubServer(model_root, repo=REPO) as server, pytest.raises(UserError, match="not found on"):
        _fetch(server, tmp_path)


def test_an_unreachable_endpoint(tmp_path):
    with HubServer(tmp_path, repo=REPO) as server:
        url = server.url  # a port that was just free, now closed
    with pytest.raises(UserError) as e:
        fetch_tokenizer(REPO, endpoint=url, cache_dir=tmp_path / "hf-cache", backoff=0.01)
    assert _one_line(e).startswith(f"cannot reach {url} to fetch the tokenizer of {REPO} (ConnectError: ")
    assert _one_line(e).endswith("check HF_ENDPOINT and your connection")


def test_not_a_repo_id(tmp_path):
    with pytest.raises(UserError, match=r"^--encoding 'gpt2': expected a Hub model repo ORG/NAME or ORG/NAME@REVISION"):
        fetch_tokenizer("gpt2", endpoint="http://127.0.0.1:9", cache_dir=tmp_path)


def _run(code: str, env: dict) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_"))}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, timeout=120)


def test_the_environment_a_user_sets(model_root, tmp_path):
    """HF_ENDPOINT, HF_HUB_CACHE and HF_TOKEN as a user exports them; then HF_HUB_OFFLINE=1 with the cache."""
    code = ("import sys\nfrom tokenshards.encoding.hubtokenizer import fetch_tokenizer\nfrom tokenshards.errors import UserError\n"
            "try:\n    t = fetch_tokenizer(sys.argv[1] if len(sys.argv) > 1 else 'TinyOrg/tiny-bpe-1.0@v2', announce=print)\n"
            "except UserError as e:\n    print(e)\n    raise SystemExit(2)\n"
            "print(t.revision, t.folder, ','.join(t.files))\n")
    env = {"HF_HUB_CACHE": str(tmp_path / "cache"), "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_XET": "1"}
    with HubServer(model_root, repo=REPO, repo_type="model", branches=("main", "v2"), gated=True, tokens=TOKENS) as server:
        env["HF_ENDPOINT"] = server.url
        denied = _run(code, env)
        assert denied.returncode == 2 and denied.stdout.strip().endswith("is gated or private: accept its licence on "
                                                                         "the Hub and set HF_TOKEN (a token with read access)")
        done = _run(code, {**env, "HF_TOKEN": TOKEN})
        assert done.returncode == 0, done.stderr
        assert TOKEN not in done.stdout + done.stderr
        revision, folder, files = done.stdout.splitlines()[-1].split(" ")
        assert revision == server.commit and files == "tokenizer.json,tokenizer_config.json"
        assert Path(folder) == tmp_path / "cache" / f"models--TinyOrg--tiny-bpe-1.0/snapshots/{server.commit}"
        served = len(server.downloads())
    offline = _run(code, {**env, "HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 0, offline.stdout + offline.stderr
    assert offline.stdout.splitlines() == [f"using the cached tokenizer of {REPO} at {server.commit[:12]} (v2): "
                                           "tokenizer.json, tokenizer_config.json",
                                           f"{server.commit} {folder} tokenizer.json,tokenizer_config.json"]
    assert served == 2
    missing = _run(code, {**env, "HF_HUB_OFFLINE": "1"} | {"HF_HUB_CACHE": str(tmp_path / "empty")})
    assert missing.returncode == 2 and "has no tokenizer.json or tokenizer.model in the cache" in missing.stdout


def test_tokenize_with_a_hub_repo_id_through_the_cli(model_root, tmp_path):
    """`tokenize --encoding ORG/NAME@BRANCH` of a gated repo: the client downloads the tokenizer
    files once, the workers get them from the plugin (no worker asks the Hub), the manifest
    records the repo at its resolved commit, ids equal `tokenizers`' and `verify --deep` agrees."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [*SENTENCES[:6], "text with <|endoftext|> inside", None, ""]
    corpus = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": texts, "id": [f"d{i}" for i in range(len(texts))]}), corpus)
    out = tmp_path / "out"
    tokenshards = str(Path(sys.executable).with_name("tokenshards"))
    env = {"HF_HUB_CACHE": str(tmp_path / "cache"), "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_XET": "1",
           "HF_TOKEN": TOKEN}
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_"))}
    with HubServer(model_root, repo=REPO, repo_type="model", branches=("main", "v2"), gated=True, tokens=TOKENS) as server:
        env["HF_ENDPOINT"] = server.url
        run = subprocess.run([tokenshards, "tokenize", "--input", str(corpus), "--out", str(out), "--encoding",
                              f"{REPO}@v2", "--workers", "2", "--progress", "none", "--no-dashboard"],
                             env={**base, **env}, capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, run.stdout + run.stderr
        assert TOKEN not in run.stdout + run.stderr
        assert len(server.downloads()) == 2  # tokenizer.json and tokenizer_config.json, by the client alone
        check = subprocess.run([tokenshards, "verify", str(out), "--deep", "20", "--workers", "1", "--progress", "none",
                                "--no-dashboard"], env={**base, **env}, capture_output=True, text=True,
                               timeout=240)
        assert check.returncode == 0 and "re-tokenized: OK" in check.stdout, check.stdout + check.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    enc = manifest["encoding"]
    assert enc["kind"] == "hf" and enc["source"] == f"{REPO}@{server.commit}"
    assert [f["name"] for f in enc["files"]] == ["tokenizer.json", "tokenizer_config.json"]
    eot = Tokenizer.from_str(_tokenizer_json().decode()).token_to_id("<|endoftext|>")
    assert (enc["prefix"], enc["suffix"], manifest["eot_position"]) == ([], [eot], "suffix")
    reference = Tokenizer.from_str((model_root / "tokenizer.json").read_text())
    reference.encode_special_tokens = True
    [part] = manifest["partitions"]
    tokens = np.load(out / part["tokens_file"])
    docs = pq.read_table(out / part["docs_file"]).to_pylist()
    assert [d["row"] for d in docs] == list(range(7))
    for d in docs:
        want = reference.encode(texts[d["row"]], add_special_tokens=False).ids + [eot]
        assert tokens[d["start"]:d["start"] + d["length"]].tolist() == want
