"""stackfarm.throughput.measure without a GPU: settings, nvidia-smi parsing, server arguments, and real
server processes (tests/test_throughput_fixtures/fake_sglang, a tiny HTTP server speaking the parts of
SGLang's protocol the suite uses) that start, never become healthy, crash, or stream zero tokens.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from stackfarm.artifacts import Cache, Source, Target, find_artifact
from stackfarm.numerics.tinymodels import ModelInputError
from stackfarm.throughput._tiny import check_models, write_dummy_pair
from stackfarm.throughput.measure import (
    BASELINE,
    EAGLE3,
    PORT_RANGE,
    BenchError,
    CpuPlacement,
    MeasureError,
    Measurement,
    ModelPaths,
    PortInUseError,
    RequestResult,
    ServerSpec,
    ServerStartError,
    Settings,
    ZeroTokensError,
    available_cpus,
    cpu_placement,
    ensure_port_free,
    figures,
    free_ports,
    generate,
    launch,
    parse_gpu_csv,
    physical_cores,
    pinned,
    schedule,
    server_configs,
    server_env,
    sglang_server_argv,
    spread,
    summarise,
    warm_up,
)
from stackfarm.throughput.stats import FailureKind, classify
from stackfarm.throughput.thresholds import figure_names

FIXTURES = Path(__file__).resolve().parent / "test_throughput_fixtures"
FAKE_SGLANG = FIXTURES / "fake_sglang"
HOST = "127.0.0.1"
H200_CSV = "0, NVIDIA H200, 580.159.04, 1980, 3201, 1980, 3201, 700.00, 118.42, 34, P0, 143771\n"

# ------------------------------------------------------------------------------------------ settings


def test_settings_defaults_fit_the_h200_budget() -> None:
    s = Settings.from_mapping({})
    assert (s.repeats, s.batch_sizes, s.output_tokens) == (5, (1, 8), 128)
    assert s.configs() == (BASELINE, EAGLE3)
    assert s.cuda_graph == (BASELINE,)  # EAGLE-3 without graphs: its capture needs nvidia-cutlass-dsl


def test_settings_from_toml_lists_and_unknown_keys() -> None:
    s = Settings.from_mapping({"batch_sizes": [1, 4, 16], "cuda_graph": [], "eagle3": False})
    assert s.batch_sizes == (1, 4, 16)
    assert s.cuda_graph == ()
    assert s.configs() == (BASELINE,)
    with pytest.raises(MeasureError, match="did you mean `repeats`"):
        Settings.from_mapping({"repeat": 5})


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"repeats": 1}, "at least 2 samples"),
        ({"batch_sizes": [0]}, "positive integers"),
        ({"output_tokens": 1}, "at least 2 tokens"),
        ({"cuda_graph": ["eagle"]}, "unknown configurations"),
        ({"model_path": "/m"}, "draft_model_path"),
        ({"bench_tool": "serving"}, "one_batch_server"),
        ({"mem_fraction_static": [0.3]}, "one value per configuration"),
    ],
)
def test_settings_validation(raw: dict[str, object], message: str) -> None:
    with pytest.raises(MeasureError, match=message):
        Settings.from_mapping(raw)


# ------------------------------------------------------------------------------------------ GPU facts


def test_parse_nvidia_smi_csv() -> None:
    (gpu,) = parse_gpu_csv(H200_CSV)
    assert (gpu.index, gpu.name, gpu.driver, gpu.pstate) == (0, "NVIDIA H200", "580.159.04", "P0")
    assert (gpu.sm_clock_mhz, gpu.max_sm_clock_mhz, gpu.power_limit_w) == (1980.0, 1980.0, 700.0)
    two = parse_gpu_csv(H200_CSV + H200_CSV.replace("0, ", "1, ", 1).replace("700.00", "[N/A]"))
    assert [g.index for g in two] == [0, 1]
    assert two[1].power_limit_w is None
    with pytest.raises(MeasureError, match="expected 12"):
        parse_gpu_csv("0, NVIDIA H200, 580.159.04\n")


# ------------------------------------------------------------------------------------------ CPU placement


def _sysfs(root: Path, cores: dict[int, tuple[int, int]], unreadable: Sequence[int] = ()) -> Path:
    for cpu, (package, core) in cores.items():
        topology = root / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{package}\n")
        (topology / "core_id").write_text(f"{core}\n")
    for cpu in unreadable:
        (root / f"cpu{cpu}").mkdir(parents=True)
    return root


def test_physical_cores_groups_smt_siblings(tmp_path: Path) -> None:
    # Linux numbers the second hyperthread of core c as c + cores: 0/4, 1/5, ... on two packages.
    sysfs = _sysfs(
        tmp_path, {0: (0, 0), 1: (0, 1), 2: (1, 0), 3: (1, 1), 4: (0, 0), 5: (0, 1), 6: (1, 0), 7: (1, 1)}
    )
    assert physical_cores(range(8), sysfs) == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert physical_cores([5, 1, 3], sysfs) == ((1, 5), (3,))


def test_a_cpu_without_topology_is_its_own_core(tmp_path: Path) -> None:
    sysfs = _sysfs(tmp_path, {0: (0, 0), 1: (0, 0)}, unreadable=[2])
    assert physical_cores([0, 1, 2], sysfs) == ((0, 1), (2,))


def test_physical_cores_of_this_machine_partition_its_cpus() -> None:
    cores = physical_cores(available_cpus())
    flat = [cpu for core in cores for cpu in core]
    assert sorted(flat) == sorted(available_cpus())
    assert len(flat) == len(set(flat))


def test_cpu_placement_gives_each_server_whole_cores_of_its_own() -> None:
    cores = [(i, i + 8) for i in range(8)]  # 8 physical cores, 16 CPUs: the H200 machine's shape
    placement = cpu_placement(cores, 2)
    assert placement is not None
    assert placement.client == (0, 8)
    assert placement.servers == ((1, 9, 2, 10, 3, 11), (4, 12, 5, 13, 6, 14))  # core 7 is left idle
    everyone = [*placement.client, *placement.servers[0], *placement.servers[1]]
    assert len(everyone) == len(set(everyone))


@pytest.mark.parametrize(("cores", "servers"), [(4, 2), (2, 1), (0, 1), (8, 0)])
def test_too_few_cores_pin_nothing(cores: int, servers: int) -> None:
    assert cpu_placement([(i,) for i in range(cores)], servers) is None


def test_cpu_placement_for_one_server_takes_the_rest() -> None:
    placement = cpu_placement([(i,) for i in range(3)], 1)
    assert placement == CpuPlacement(client=(0,), servers=((1, 2),))


# ------------------------------------------------------------------------------------------ server arguments


def test_server_configs_for_the_tiny_model() -> None:
    model = ModelPaths(target="/m/t", draft="/m/d", load_format="dummy")
    base, spec = server_configs(Settings.from_mapping({}), model)
    assert base.label == BASELINE
    assert base.cuda_graph
    assert base.args[base.args.index("--cuda-graph-max-bs") + 1] == "8"
    assert "--skip-tokenizer-init" in base.args
    assert "--speculative-algorithm" not in base.args
    assert base.args[base.args.index("--attention-backend") + 1] == "triton"
    assert base.args[base.args.index("--load-format") + 1] == "dummy"
    assert spec.label == EAGLE3
    assert not spec.cuda_graph
    assert "--disable-cuda-graph" in spec.args
    assert spec.args[spec.args.index("--speculative-draft-model-path") + 1] == "/m/d"
    assert spec.args[spec.args.index("--speculative-draft-load-format") + 1] == "dummy"
    assert "without CUDA graphs" in spec.note
    assert "not like for like" in spec.note
    argv = sglang_server_argv("/py", base, HOST, 31000)
    assert argv[:3] == ("/py", "-m", "sglang.launch_server")
    assert argv[-4:] == (
        "--host",
        HOST,
        "--port",
        "31000",
    )


def test_servers_sleep_on_idle_unless_turned_off() -> None:
    model = ModelPaths(target="/m/t", draft="/m/d", load_format="dummy")
    assert all("--sleep-on-idle" in c.args for c in server_configs(Settings.from_mapping({}), model))
    awake = server_configs(Settings.from_mapping({"sleep_on_idle": False}), model)
    assert not any("--sleep-on-idle" in c.args for c in awake)


@pytest.mark.integration
@pytest.mark.parametrize("version", ["0.5.9", "0.5.10", "0.5.15"])
def test_every_server_flag_exists_in_the_real_sglang(version: str) -> None:
    """Each flag the suite passes is one this SGLang's server_args.py declares: a literal "--flag"
    (0.5.9, 0.5.10) or a ServerArgs field the parser turns into one (0.5.15 derives flags from names)."""
    source = Source(name="pypi", url="https://pypi.org/simple")
    target = Target(python="3.11", platform="manylinux_2_39_x86_64")
    tree = Cache().unpack(find_artifact(source, "sglang", version, target))
    text = (tree / "sglang" / "srt" / "server_args.py").read_text(encoding="utf-8")
    model = ModelPaths(target="/m/t", draft="/m/d", load_format="dummy")
    flags = {
        a for c in server_configs(Settings.from_mapping({}), model) for a in c.args if a.startswith("--")
    }
    assert "--sleep-on-idle" in flags
    missing = [
        f
        for f in sorted(flags)
        if f'"{f}"' not in text and re.search(rf"^\s+{f[2:].replace('-', '_')}\s*:", text, re.M) is None
    ]
    assert missing == []


def test_server_configs_for_a_real_checkpoint_pass_no_load_format() -> None:
    model = ModelPaths(target="/m/t", draft="/m/d", load_format=None)
    settings = Settings.from_mapping(
        {"cuda_graph": ["baseline", "eagle3"], "extra_server_args": ["--tp", "8"]}
    )
    base, spec = server_configs(settings, model)
    assert "--load-format" not in base.args
    assert "--speculative-draft-load-format" not in spec.args
    assert spec.cuda_graph
    assert spec.note == ""
    assert spec.args[-2:] == ("--tp", "8")


def test_server_env_is_offline_and_puts_the_cell_sglang_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toolkit = tmp_path / "cuda"
    for name in ("bin/nvcc", "include/cuda_runtime.h", "lib64/libcudart.so.13"):
        (toolkit / name).parent.mkdir(parents=True, exist_ok=True)
        (toolkit / name).write_text("")
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    env = server_env("/cell/sglang-tree", tmp_path / "scratch")
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep) == ["/cell/sglang-tree", "/somewhere"]
    # the toolkit has only libcudart.so.13: a shim adds lib64/libcudart.so for tvm-ffi's link line
    home = Path(env["CUDA_HOME"])
    assert home == tmp_path / "scratch" / "cuda-home"
    assert (home / "lib64" / "libcudart.so").resolve() == (toolkit / "lib64/libcudart.so.13").resolve()
    assert (home / "bin" / "nvcc").exists()
    assert env["PATH"].split(os.pathsep)[0] == str(home / "bin")


def test_tiny_pair_is_the_numerics_shape_and_fits(tmp_path: Path) -> None:
    target, draft = write_dummy_pair(tmp_path)
    check_models(str(target), str(draft))  # raises when the draft cannot serve the target
    config = json.loads((draft / "config.json").read_text(encoding="utf-8"))
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]
    assert not list(target.glob("*.safetensors")), "dummy weights: SGLang fills them, nothing is written"


def test_the_llama_3_8b_shape_has_its_dimensions_and_a_fitting_draft(tmp_path: Path) -> None:
    target, draft = write_dummy_pair(tmp_path, "llama-3-8b")
    assert target.name == "llama-3-8b-llama"
    check_models(str(target), str(draft))
    config = json.loads((target / "config.json").read_text(encoding="utf-8"))
    dims = {k: config[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size")}
    assert dims == {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "vocab_size": 128256,
    }
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (32, 8, 128)
    drafted = json.loads((draft / "config.json").read_text(encoding="utf-8"))
    assert (drafted["target_hidden_size"], drafted["draft_vocab_size"]) == (4096, 128256)


def test_an_unknown_model_shape_names_the_known_ones() -> None:
    with pytest.raises(MeasureError, match=r"model_shape = 'llama3-8b'.*did you mean `llama-3-8b`"):
        Settings.from_mapping({"model_shape": "llama3-8b"})


def test_configured_models_are_checked_before_any_server(tmp_path: Path) -> None:
    target, draft = write_dummy_pair(tmp_path)
    with pytest.raises(ModelInputError, match="does not exist"):
        check_models(str(tmp_path / "missing"), None)
    small = json.loads((target / "config.json").read_text(encoding="utf-8")) | {"num_hidden_layers": 2}
    (target / "config.json").write_text(json.dumps(small), encoding="utf-8")
    with pytest.raises(ModelInputError, match="the target has only 2"):
        check_models(str(target), str(draft))


# ------------------------------------------------------------------------------------------ ports


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_port_in_use_is_named(busy_port: int) -> None:
    with pytest.raises(PortInUseError, match=f"port {busy_port} on {HOST} is already in use"):
        ensure_port_free(HOST, busy_port)
    with pytest.raises(PortInUseError):
        free_ports(HOST, 2, start=busy_port)


def test_free_ports_stay_where_sglang_accepts_them() -> None:
    ports = free_ports(HOST, 3)
    assert len(set(ports)) == 3
    assert all(
        PORT_RANGE[0] <= p < PORT_RANGE[1] for p in ports
    )  # SGLang 0.5.15 refuses port + 10000 > 65535


# ------------------------------------------------------------------------------------------ real server processes


def fake_spec(
    tmp_path: Path,
    port: int,
    *,
    mode: str = "ok",
    timeout: float = 30.0,
    step_s: float = 0.001,
    extra: Sequence[str] = (),
) -> ServerSpec:
    env = {
        **os.environ,
        "PYTHONPATH": str(FAKE_SGLANG),
        "FAKE_SGLANG_MODE": mode,
        "FAKE_SGLANG_TOKEN_S": str(step_s),
        "FAKE_SGLANG_START_S": "0.2",
    }
    return ServerSpec(
        label="baseline",
        argv=(sys.executable, "-m", "sglang.launch_server", *extra, "--host", HOST, "--port", str(port)),
        host=HOST,
        port=port,
        env=env,
        log=tmp_path / f"{mode}.log",
        health_timeout=timeout,
        probe_timeout=0.5,
        poll_interval=0.1,
    )


def test_a_pinned_server_runs_on_its_cpus(tmp_path: Path) -> None:
    cpu = available_cpus()[-1]
    (port,) = free_ports(HOST, 1)
    spec = dataclasses.replace(fake_spec(tmp_path, port), cpus=(cpu,))
    with launch(spec) as server:
        assert os.sched_getaffinity(server.process.pid) == {cpu}
    assert os.sched_getaffinity(0) == set(available_cpus())  # the client is untouched


def test_pinned_moves_this_process_and_back() -> None:
    before = os.sched_getaffinity(0)
    cpu = min(before)
    with pinned((cpu,)):
        assert os.sched_getaffinity(0) == {cpu}
    assert os.sched_getaffinity(0) == before
    with pinned(None):
        assert os.sched_getaffinity(0) == before


def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_server_that_never_becomes_healthy_times_out_with_the_log_tail(tmp_path: Path) -> None:
    (port,) = free_ports(HOST, 1)
    start = time.monotonic()
    with pytest.raises(ServerStartError) as info:
        launch(fake_spec(tmp_path, port, mode="never-healthy", timeout=2.0))
    assert time.monotonic() - start < 15
    text = str(info.value)
    assert "baseline server not healthy after 2 s" in text
    assert f"last lines of {tmp_path / 'never-healthy.log'}" in text
    assert "[fake sglang] health check received; the scheduler is stuck" in text  # the log's tail
    assert classify(text) is FailureKind.TIMEOUT
    assert port_is_free_again(port)


def port_is_free_again(port: int) -> bool:
    for _ in range(50):
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                time.sleep(0.1)
                continue
            return True
    return False


def test_server_that_crashes_reports_exit_code_and_import_error(tmp_path: Path) -> None:
    (port,) = free_ports(HOST, 1)
    with pytest.raises(ServerStartError) as info:
        launch(fake_spec(tmp_path, port, mode="crash"))
    text = str(info.value)
    assert "exited with code 1 before it became healthy" in text
    assert "ImportError: cannot import name 'fp8_kernel'" in text
    assert classify(text) is FailureKind.IMPORT_ERROR  # an import error is never retried


def test_port_already_in_use_is_refused_before_starting(tmp_path: Path, busy_port: int) -> None:
    spec = fake_spec(tmp_path, busy_port)
    with pytest.raises(PortInUseError, match=str(busy_port)):
        launch(spec)
    assert not spec.log.exists(), "nothing may start on a port someone else holds"


def test_healthy_server_measures_and_stops_its_group(tmp_path: Path) -> None:
    (port,) = free_ports(HOST, 1)
    server = launch(fake_spec(tmp_path, port))
    try:
        one = generate(server.base_url, [[5, 6, 7]], 16, timeout=30)
        assert one.tokens == (16,)
        assert one.batch_size == 1
        assert one.output_tok_s > 0
        assert one.last_ttft_s > 0
        assert one.accept_length is None
        batch = generate(server.base_url, [[5, 6], [7, 8], [9, 10]], 12, timeout=30)
        assert batch.tokens == (12, 12, 12)  # the events carried "index" for the batched input
        assert batch.output_tok_s > one.output_tok_s  # three streams at once
    finally:
        server.stop()
    assert not server.alive()
    assert _gone(server.process.pid)


def test_servers_die_with_a_killed_parent(tmp_path: Path) -> None:
    """A runner timeout SIGKILLs pytest with no cleanup; the servers must not live on holding the GPU."""
    (port,) = free_ports(HOST, 1)
    script = (
        "import sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from pathlib import Path\n"
        "from test_throughput_measure import fake_spec\n"
        "from stackfarm.throughput.measure import launch\n"
        f"server = launch(fake_spec(Path({str(tmp_path)!r}), {port}))\n"
        "print(server.process.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    server_pid = int(parent.stdout.readline())
    os.kill(server_pid, 0)  # alive
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not _gone(server_pid):
        time.sleep(0.1)
    assert _gone(server_pid), "the server outlived the process that started it"


def test_speculative_server_reports_accept_length(tmp_path: Path) -> None:
    (port,) = free_ports(HOST, 1)
    with launch(fake_spec(tmp_path, port, extra=("--speculative-algorithm", "EAGLE3"))) as server:
        result = generate(server.base_url, [[1, 2, 3]], 17, timeout=30)
    assert result.tokens == (17,)
    assert result.first_tokens == (1,)
    assert result.accept_length == pytest.approx(17 / 9)  # 1 + ceil(16 / 2) verify steps


def test_bench_returning_zero_tokens_is_an_error(tmp_path: Path) -> None:
    (port,) = free_ports(HOST, 1)
    with (
        launch(fake_spec(tmp_path, port, mode="zero-tokens")) as server,
        pytest.raises(ZeroTokensError, match="returned 0 tokens") as info,
    ):
        generate(server.base_url, [[1, 2, 3]], 16, timeout=30)
    assert classify(str(info.value)) is FailureKind.ZERO_TOKENS


def test_measurement_against_real_processes_interleaves_and_pairs(tmp_path: Path) -> None:
    settings = Settings.from_mapping(
        {
            "repeats": 3,
            "batch_sizes": [1, 2],
            "output_tokens": 8,
            "warmup_tolerance": 10.0,
            "warmup_batches": 1,
        }
    )
    base_port, spec_port = free_ports(HOST, 2)
    with (
        launch(fake_spec(tmp_path, base_port, step_s=0.005)) as base,
        launch(
            fake_spec(tmp_path / "s", spec_port, step_s=0.005, extra=("--speculative-algorithm", "EAGLE3"))
        ) as spec,
    ):
        m = Measurement({BASELINE: base.base_url, EAGLE3: spec.base_url}, settings)
        warm = m.warm_up()
        m.run_rounds(settings.repeats)
        got = m.figures()
    assert warm[BASELINE].stable
    assert len(warm[BASELINE].rates) == settings.warmup_window
    assert set(got) == set(figure_names([1, 2], eagle3=True))
    assert all(len(v) == 3 for v in got.values())
    # EAGLE-3 streams 2 tokens a step in the fake (15 tokens after the first: 8 steps against 15)
    assert statistics.median(got["eagle3_over_baseline"]) > 1.2, got


# ------------------------------------------------------------------------------------------ pure parts


def _events(
    times_tokens: Sequence[tuple[float, int]], *, index: int | None = None, accept: float | None = None
) -> list[tuple[float, dict[str, object]]]:
    out: list[tuple[float, dict[str, object]]] = []
    for t, n in times_tokens:
        meta: dict[str, object] = {"completion_tokens": n}
        if accept is not None and n == times_tokens[-1][1]:
            meta["spec_accept_length"] = accept
        event: dict[str, object] = {"meta_info": meta}
        if index is not None:
            event["index"] = index
        out.append((t, event))
    return out


def test_summarise_computes_decode_rate_ttft_and_itl_exactly() -> None:
    # first token at 10 ms, then 1 token every 5 ms until 5 tokens at 30 ms
    result = summarise(
        _events([(0.010, 1), (0.015, 2), (0.020, 3), (0.025, 4), (0.030, 5)]),
        batch_size=1,
        input_len=4,
        output_len=5,
    )
    assert result.last_ttft_s == pytest.approx(0.010)
    assert result.latency_s == pytest.approx(0.030)
    assert result.output_tok_s == pytest.approx(4 / 0.020)  # 4 tokens after the first, in 20 ms
    assert result.itl_ms == pytest.approx(5.0)


def test_summarise_batch_sums_item_rates() -> None:
    events = _events([(0.01, 1), (0.03, 3)], index=0) + _events([(0.02, 1), (0.06, 3)], index=1)
    result = summarise(events, batch_size=2, input_len=2, output_len=3)
    assert result.output_tok_s == pytest.approx(2 / 0.02 + 2 / 0.04)
    assert result.last_ttft_s == pytest.approx(0.02)


def test_summarise_counts_a_first_chunk_of_several_tokens() -> None:
    result = summarise(_events([(0.01, 3), (0.02, 6)], accept=2.0), batch_size=1, input_len=2, output_len=6)
    assert result.output_tok_s == pytest.approx(3 / 0.01)
    assert result.accept_length == 2.0


@pytest.mark.parametrize(
    ("events", "error", "message"),
    [
        ([], ZeroTokensError, "returned 0 tokens"),
        (_events([(0.01, 0)]), ZeroTokensError, "returned 0 tokens"),
        (_events([(0.01, 1), (0.02, 3)]), BenchError, "came back short"),
        (_events([(0.01, 4)]), BenchError, "arrived in one chunk"),
        ([(0.01, {"error": {"message": "boom"}})], BenchError, "reported an error"),
        (_events([(0.01, 1)], index=3), BenchError, "item 3 of a batch of 1"),
    ],
)
def test_summarise_rejects_unusable_streams(
    events: list[tuple[float, dict[str, object]]], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        summarise(events, batch_size=1, input_len=2, output_len=4)


def test_summarise_names_the_empty_item_of_a_batch() -> None:
    with pytest.raises(ZeroTokensError, match=r"items \[1\]"):
        summarise(_events([(0.01, 1), (0.02, 2)], index=0), batch_size=2, input_len=2, output_len=2)


def test_warm_up_stops_once_stable() -> None:
    # the H200 reference run's rising rates, then three within 2 % (923, 960, 930 and 960, 930, 926 are not)
    rates = iter([497.0, 515.0, 374.0, 501.0, 760.0, 869.0, 923.0, 960.0, 930.0, 926.0, 928.0, 1.0])
    warm = warm_up(lambda: next(rates), window=3, tolerance=0.02, max_runs=30)
    assert warm.stable
    assert warm.rates[-3:] == (930.0, 926.0, 928.0)
    assert spread([930.0, 926.0, 928.0]) <= 0.02 < spread([923.0, 930.0, 869.0])


def test_warm_up_gives_up_unstable() -> None:
    values = iter([100.0, 200.0] * 10)
    warm = warm_up(lambda: next(values), window=3, tolerance=0.02, max_runs=6)
    assert not warm.stable
    assert len(warm.rates) == 6


def test_schedule_interleaves_a_b() -> None:
    order = schedule(("a", "b"), [1, 8], 2)
    assert [c for _, _, c in order] == ["a", "b"] * 4
    assert [(r, b) for r, b, _ in order[:4]] == [(0, 1), (0, 1), (0, 8), (0, 8)]


def _result(rate: float, *, batch: int = 1) -> RequestResult:
    # a stream of 11 tokens per item, 10 after the first in 10 / rate s
    return RequestResult(batch_size=batch, input_len=4, output_len=11, tokens=(11,) * batch, first_s=(0.01,) * batch,
                         last_s=(0.01 + 10 / rate,) * batch, first_tokens=(1,) * batch, accept_length=None)  # fmt: skip


def test_figures_pair_the_interleaved_requests() -> None:
    results = {(BASELINE, 1): [_result(100.0), _result(110.0)], (EAGLE3, 1): [_result(50.0), _result(66.0)]}
    got = figures(results)
    assert got["decode_tok_s"] == pytest.approx([100.0, 110.0])
    assert got["eagle3_over_baseline"] == pytest.approx([0.5, 0.6])
    assert got["itl_ms"] == pytest.approx([10.0, 1000 / 110])


def test_remeasure_returns_only_the_new_samples_of_its_batch() -> None:
    rates = iter(float(r) for r in range(100, 200))
    requests: list[int] = []

    def fake_run(url: str, prompts: Sequence[Sequence[int]], n: int) -> RequestResult:
        requests.append(len(prompts))
        return _result(next(rates), batch=len(prompts))

    settings = Settings.from_mapping({"repeats": 2, "batch_sizes": [1, 4]})
    m = Measurement({BASELINE: "http://a", EAGLE3: "http://b"}, settings, run=fake_run)
    m.run_rounds(settings.repeats)
    assert requests == [1, 1, 4, 4, 1, 1, 4, 4]
    before = m.figures()["batch4_tok_s"]
    more = m.remeasure("batch4_tok_s")()
    assert len(more) == 2
    assert m.figures()["batch4_tok_s"] == before + more
    assert requests[8:] == [4, 4, 4, 4]  # only batch 4, both configurations, interleaved
