"""Every flag reaches the library: each command is invoked with all its options set, the library
function it calls is replaced by a mock, and the one settings object it received is compared whole."""

from pathlib import Path
from unittest.mock import patch

from click.testing import CliRunner

from specpipe.bench.job import BenchOutcome, BenchRequest
from specpipe.bench.runner import BenchRun, BenchSettings
from specpipe.bench.tune import TuneRequest, TuneResult
from specpipe.build_request import BuildRequest
from specpipe.cli import main
from specpipe.client.generate import GenerateJob
from specpipe.client.llm import GenerationResult
from specpipe.client.request import GenerationRequest
from specpipe.serve import ServeRequest


def invoke(*args):
    return CliRunner().invoke(main, list(args))


def test_build_cpu_receives_every_flag():
    with (
        patch("specpipe.build_cpu.build_cpu") as build_cpu,
        patch("specpipe.trtllm.build.build_trtllm") as build_trtllm,
    ):
        result = invoke(
            "build",
            "--target",
            "t",
            "--draft",
            "eagle",
            "--runtime",
            "cpu",
            "--name",
            "n",
            "--engines-dir",
            "e",
            "--max-draft-len",
            "3",
            "--draft-model",
            "d",
            "--choices",
            "[[0]]",
            "--dry-run",
            "--json",
            "--force",
        )
    assert result.exit_code == 0, result.output
    assert build_trtllm.call_count == 0
    build_cpu.assert_called_once_with(
        BuildRequest(
            target="t",
            draft="eagle",
            runtime="cpu",
            name="n",
            engines_dir=Path("e"),
            max_draft_len=3,
            draft_model="d",
            choices="[[0]]",
            dry_run=True,
            json_output=True,
            force=True,
        )
    )


def test_build_trtllm_receives_every_flag():
    with (
        patch("specpipe.build_cpu.build_cpu") as build_cpu,
        patch("specpipe.trtllm.build.build_trtllm") as build_trtllm,
    ):
        result = invoke(
            "build",
            "--target",
            "t",
            "--draft",
            "lookahead",
            "--runtime",
            "trtllm",
            "--gpu",
            "h100-80gb",
            "--tp",
            "2",
            "--pp",
            "3",
            "-q",
            "fp8",
            "--max-batch-size",
            "4",
            "--max-input-len",
            "100",
            "--max-seq-len",
            "200",
            "--lookahead",
            "7,6,5",
            "--executor",
            "docker",
        )
    assert result.exit_code == 0, result.output
    assert build_cpu.call_count == 0
    build_trtllm.assert_called_once_with(
        BuildRequest(
            target="t",
            draft="lookahead",
            runtime="trtllm",
            engines_dir=Path("engines"),
            gpu="h100-80gb",
            tp=2,
            pp=3,
            quantization="fp8",
            max_batch_size=4,
            max_input_len=100,
            max_seq_len=200,
            lookahead=(7, 6, 5),
            executor="docker",
        )
    )


def test_quantization_is_a_choice_of_the_registry():
    result = invoke("build", "--target", "t", "-q", "fp4")
    assert (
        result.exit_code == 2
        and "'fp4' is not one of 'auto', 'bf16', 'fp16', 'fp8', 'int4-awq', 'int8-wo', 'int4-wo'" in result.output
    )


def test_package_receives_engine_and_repository_paths():
    with (
        patch("specpipe.triton.repository.package_engine", return_value=Path("r/x")) as package_engine,
        patch("specpipe.triton.repository.package_plan", return_value=Path("r/p")) as package_plan,
    ):
        result = invoke("package", "x", "--engines-dir", "e", "--repo-dir", "r")
        assert result.exit_code == 0 and "wrote Triton model repository r/x" in result.output
        package_engine.assert_called_once_with(
            Path("e/x"), Path("r/x"), dense_rows="auto", draft_lengths="adaptive", warm_up=True
        )
        result = invoke("package", "--from-plan", __file__, "--name", "p", "--repo-dir", "r")
        assert result.exit_code == 0, result.output
        package_plan.assert_called_once_with(Path(__file__), "p", Path("r"))


def test_package_refuses_a_path_as_the_name():
    with (
        patch("specpipe.triton.repository.package_engine") as package_engine,
        patch("specpipe.triton.repository.package_plan") as package_plan,
    ):
        for args in (("../eng/x",), ("a/b",), ("--from-plan", __file__, "--name", "../up")):
            result = invoke("package", *args, "--repo-dir", "r")
            assert (
                result.exit_code == 2 and "is not an engine name" in result.output and "--engines-dir" in result.output
            )
    assert package_engine.call_count == package_plan.call_count == 0


def test_serve_receives_every_flag():
    with patch("specpipe.serve.serve") as serve:
        result = invoke(
            "serve",
            "x",
            "--repo-dir",
            "r",
            "--grpc-port",
            "9001",
            "--http-port",
            "9000",
            "--metrics-port",
            "9002",
            "--runtime",
            "trtllm",
            "--print",
            "--container",
            "img",
            "--gpus",
            "0,1",
            "--openai-port",
            "9050",
        )
    assert result.exit_code == 0, result.output
    serve.assert_called_once_with(
        ServeRequest(
            Path("r/x"),
            grpc_port=9001,
            http_port=9000,
            metrics_port=9002,
            runtime="trtllm",
            print_only=True,
            container="img",
            gpus="0,1",
            openai_port=9050,
        )
    )


def test_generate_receives_every_flag_and_prints_the_text():
    done = GenerationResult(text="four", perf={"num_output_tokens": 1})
    with patch("specpipe.client.generate.generate", return_value=done) as generate:
        result = invoke(
            "generate",
            "2+2=",
            "--url",
            "h:1",
            "--model",
            "m",
            "--max-tokens",
            "5",
            "--temperature",
            "0.5",
            "--top-k",
            "3",
            "--top-p",
            "0.9",
            "--seed",
            "7",
            "--chat",
            "--stats",
        )
    assert result.exit_code == 0, result.output
    assert result.stdout == "four\n" and "1 tokens in" in result.stderr
    job = generate.call_args.args[0]
    assert job == GenerateJob(
        url="h:1",
        model="m",
        chat=True,
        request=GenerationRequest(
            prompt="2+2=", max_tokens=5, stream=False, temperature=0.5, top_k=3, top_p=0.9, seed=7
        ),
    )


def test_generate_samples_with_a_temperature_alone_and_says_when_a_seed_does_nothing():
    done = GenerationResult(text="x")
    with patch("specpipe.client.generate.generate", return_value=done) as generate:
        assert invoke("generate", "p", "--temperature", "0.9", "--seed", "4").exit_code == 0
        assert generate.call_args.args[0].request == GenerationRequest(
            prompt="p", max_tokens=128, temperature=0.9, top_p=1.0, seed=4
        )
        result = invoke("generate", "p", "--seed", "4")
        assert generate.call_args.args[0].request == GenerationRequest(prompt="p", max_tokens=128)
        assert "--seed has no effect" in result.stderr


def test_generate_refuses_counts_and_seeds_its_tensors_cannot_hold():
    with patch("specpipe.client.generate.generate") as generate:
        result = invoke("generate", "p", "--max-tokens", "4294967301")
        assert result.exit_code == 2 and "must be at most 2147483647 (a 32-bit count), got 4294967301" in result.output
        result = invoke("generate", "p", "--seed", "99999999999999999999999")
        assert result.exit_code == 2 and "--seed" in result.output and "0<=x<=18446744073709551615" in result.output
        assert invoke("generate", "p", "--seed", "-1").exit_code == 2
    assert generate.call_count == 0


def test_bench_receives_every_flag():
    outcome = BenchOutcome(
        run=BenchRun(settings=BenchSettings(prompts="code", concurrencies=(1,))), out_dir=Path("o"), paths={}
    )
    with (
        patch("specpipe.bench.job.run_benchmark", return_value=outcome) as run_benchmark,
        patch("specpipe.bench.table.comparison_table", return_value="table"),
    ):
        result = invoke(
            "bench",
            "--url",
            "baseline=h:1",
            "--url",
            "n=h:2",
            "--prompts",
            "code",
            "--concurrency",
            "2,1,2",
            "--max-tokens",
            "9",
            "--duration",
            "3",
            "--warmup",
            "0",
            "--out",
            "o",
            "--chat",
            "--metrics",
            "n=none",
            "--tokenizer",
            "tok",
            "--timeout",
            "5",
            "--baseline",
            "n",
            "--model",
            "m",
        )
    assert result.exit_code == 0, result.output
    run_benchmark.assert_called_once_with(
        BenchRequest(
            urls=("baseline=h:1", "n=h:2"),
            prompts="code",
            concurrency=(2, 1),
            max_tokens=9,
            num_requests=None,
            duration=3.0,
            warmup=0,
            out=Path("o"),
            chat=True,
            metrics=("n=none",),
            tokenizer="tok",
            timeout=5.0,
            baseline="n",
            model="m",
        )
    )


def test_tune_receives_every_flag():
    with patch("specpipe.bench.tune.tune", return_value=TuneResult("x", [], None, None)) as tune:
        result = invoke(
            "tune",
            "x",
            "--prompts",
            "code",
            "--max-draft-len",
            "4,2",
            "--concurrency",
            "2",
            "--max-tokens",
            "9",
            "--num-requests",
            "3",
            "--warmup",
            "0",
            "--engines-dir",
            "e",
            "--draft",
            "ngram",
            "--chat",
            "--keep",
        )
    assert result.exit_code == 1 and "no setting of x could be measured" in result.output
    tune.assert_called_once_with(
        TuneRequest(
            name="x",
            engines_dir=Path("e"),
            prompts="code",
            lengths=(4, 2),
            concurrency=2,
            max_tokens=9,
            num_requests=3,
            warmup=0,
            draft="ngram",
            chat=True,
            keep=True,
        )
    )


def test_train_draft_offers_only_the_methods_the_registry_can_train():
    result = invoke("train-draft", "--target", "t", "--method", "ngram")
    assert result.exit_code == 2 and "'ngram' is not one of 'draft-model', 'eagle', 'medusa'" in result.output


def test_train_draft_receives_every_flag(tmp_path):
    from specpipe.training.command import TrainRequest

    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "hi"}\n')
    with patch("specpipe.training.command.train_draft") as train_draft:
        result = invoke(
            "train-draft",
            "--target",
            "smollm2-135m",
            "--method",
            "medusa",
            "--data",
            str(data),
            "--budget",
            "2.5",
            "--max-steps",
            "7",
            "--schedule-steps",
            "9",
            "--out",
            "o",
            "--seed",
            "3",
            "--num-prompts",
            "5",
            "--stdlib-tokens",
            "0",
            "--no-trtllm-layout",
            "--self-instruct",
            "4",
            "--style",
            "eagle3",
            "--ttt-steps",
            "2",
            "--sampled-answers",
            "1",
            "--eval-every",
            "11",
            "--patience",
            "5",
            "--checkpoint-every",
            "13",
            "--resume",
        )
    assert result.exit_code == 0, result.output
    request = train_draft.call_args.args[0]
    assert request == TrainRequest(
        target="smollm2-135m",
        method="medusa",
        data=data,
        budget_minutes=2.5,
        out_dir=Path("o"),
        seed=3,
        max_steps=7,
        schedule_steps=9,
        num_prompts=5,
        stdlib_tokens=0,
        self_instruct=4,
        export_trtllm=False,
        style="eagle3",
        resume=True,
        sampled_answers=1,
        overrides={"unroll": 2, "eval_every": 11, "patience": 5, "checkpoint_every": 13},
        command=request.command,
    )


def test_train_draft_method_is_a_choice_of_the_trainable_methods():
    result = invoke("train-draft", "--target", "smollm2-135m", "--method", "ngram")
    assert result.exit_code == 2 and "'ngram' is not one of" in result.output
