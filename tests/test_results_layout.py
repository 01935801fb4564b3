"""Committed results stay findable: every ``benchmarks/results/...`` or ``docs/results/...`` path that a
document or module cites exists, and every result there is cited somewhere, so no file is left that
nothing explains. A result is one ``specpipe bench`` run (a folder with ``bench.json``, ``bench.csv``,
``requests.csv``, ``bench.png``) or any other file. Citing a run's folder or one of its files cites the
run; citing a folder that holds only files (``fp32_kernel_choice/``) cites each of them; citing a root or
a folder of folders (``deployment_speed_triton/``) cites nothing in particular. Cog's generated output is
not read: it prints each JSON's command as recorded, whose ``--out`` is where the run first wrote it;
neither is a path at an older commit (``git show SHA:benchmarks/results/NAME.json``)."""

import re

from repo_root import ROOT

RESULT_ROOTS = ("benchmarks/results", "docs/results")
CITING = ("README.md", "docs/*.md", "docker/**/*.md", "pipeline/**/*.py", "benchmarks/*.py")
CITATION = re.compile(r"(?<![\w:-])((?:benchmarks|docs)/results(?:/[\w.-]+)*)")
COG_OUTPUT = re.compile(r"\]\]\] -->\n.*?<!-- \[\[\[end\]\]\] -->", re.S)


def citations(text: str) -> set[str]:
    """The results paths a text names, outside cog's generated output, without a trailing dot or slash."""
    return {match.rstrip(".") for match in CITATION.findall(COG_OUTPUT.sub("", text))}


def cited_paths() -> dict[str, set[str]]:
    """Each cited path and the files that cite it."""
    cited: dict[str, set[str]] = {}
    for pattern in CITING:
        for file in sorted(ROOT.glob(pattern)):
            for path in citations(file.read_text()):
                cited.setdefault(path, set()).add(str(file.relative_to(ROOT)))
    return cited


def results() -> list[str]:
    """The results under both roots: ``specpipe bench`` runs (folders) and every other file."""
    found = []
    for root in RESULT_ROOTS:
        for entry in (ROOT / root).rglob("*"):
            if (entry / "bench.json").is_file():
                found.append(entry)
            elif entry.is_file() and not (entry.parent / "bench.json").is_file():
                found.append(entry)
    return sorted(str(entry.relative_to(ROOT)) for entry in found)


def covers(citation: str, result: str) -> bool:
    """Whether citing ``citation`` cites ``result`` (see the module's docstring)."""
    if citation == result or citation.startswith(result + "/"):
        return True
    parent = (ROOT / result).parent
    return (
        citation == str(parent.relative_to(ROOT))
        and citation not in RESULT_ROOTS
        and all(entry.is_file() for entry in parent.iterdir())
    )


def test_citations_are_found_outside_cog_output_and_without_trailing_punctuation():
    text = (
        "its JSON under `benchmarks/results/`. See benchmarks/results/plain_step.json.\n"
        "<!-- [[[cog\ncog.out(table('docs/results/x/run.json'))\n]]] -->\n"
        "`python run.py --out benchmarks/results/gone.json`\n<!-- [[[end]]] -->\n"
        "default bench-results/demo, and ``docs/results/fp32_kernel_choice/plain_step_onednn.json``;\n"
        "`git show 7a7fa82:benchmarks/results/NAME.json` prints an old one"
    )
    assert citations(text) == {
        "benchmarks/results",
        "benchmarks/results/plain_step.json",
        "docs/results/x/run.json",
        "docs/results/fp32_kernel_choice/plain_step_onednn.json",
    }


def test_the_scan_reads_the_record_and_finds_its_runs():
    cited = cited_paths()
    assert "docs/cpu-measurements.md" in cited["benchmarks/results/deployment_speed_triton/methods_with_control"]
    assert "docs/experiments.md" in cited["docs/results/prompt_lookup_ceiling/ngram_ceiling.json"]
    assert "pipeline/specpipe/bench/noise.py" in cited["benchmarks/results/deployment_speed_triton"]
    assert "README.md" in cited["benchmarks/results/deployment_speed_triton"]  # the cog block's f-string
    assert len(cited) >= 30, sorted(cited)


def test_every_cited_result_path_exists():
    missing = {path: sorted(files) for path, files in cited_paths().items() if not (ROOT / path).exists()}
    assert missing == {}


def test_every_result_is_cited():
    cited = cited_paths()
    units = results()
    assert "benchmarks/results/deployment_speed_triton/methods_with_control" in units
    assert "benchmarks/results/deployment_speed_triton" not in units
    assert "benchmarks/results/deployment_speed_triton/methods_with_control/bench.csv" not in units
    assert "benchmarks/results/plain_step.json" in units
    assert "docs/results/fp32_kernel_choice/plain_step_onednn.json" in units
    uncited = [unit for unit in units if not any(covers(path, unit) for path in cited)]
    assert uncited == []


def test_what_cites_a_result():
    run = "benchmarks/results/deployment_speed_triton/methods_with_control"
    assert covers(run, run) and covers(run + "/bench.json", run)
    assert not covers("benchmarks/results/deployment_speed_triton", run)
    assert not covers("benchmarks/results", "benchmarks/results/plain_step.json")
    assert covers("docs/results/fp32_kernel_choice", "docs/results/fp32_kernel_choice/plain_step_onednn.json")
    kernels = "docs/results/fp32_kernel_choice/"
    assert not covers(kernels + "plain_step_onednn.json", kernels + "adaptive_interleaved_mkl.json")


def test_benchmarks_results_hold_each_script_s_current_result():
    """Each user benchmark's default output is there, under its script's name."""
    scripts = sorted(path.stem for path in (ROOT / "benchmarks").glob("*.py"))
    assert len(scripts) == 6, scripts
    for script in scripts:
        assert (ROOT / "benchmarks" / "results" / f"{script}.json").is_file(), script
