"""One configuration: every ERDMA_* variable the code reads is declared in
erdmampi/config.py, parsed and validated there, with errors that name the
variable; docs/config.md is generated from the declarations; erdmarun checks
the ranks' environment before starting them."""
import ast
import re
import subprocess
import sys

import pytest

from harness import REPO, erdmarun_cmd, rank_env

from erdmampi import config

NAME = re.compile(r"ERDMA_[A-Z0-9_]+")


def _c_constants():
    text = "\n".join(p.read_text() for p in (REPO / "ext").rglob("*.h"))
    return set(re.findall(r"#define\s+(ERDMA_[A-Z0-9_]+)", text))


def _names_read():
    """ERDMA_* names the code uses as strings (Python) or getenv()s (C)."""
    consts = _c_constants()
    found = {}
    for top in ("erdmampi", "launcher", "kernels", "bench"):
        for f in (REPO / top).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                        and NAME.fullmatch(node.value):
                    # lib.ERDMA_DT_... looked up by prefix: a C constant, not a variable
                    if any(c.startswith(node.value) for c in consts):
                        continue
                    found.setdefault(node.value, f.relative_to(REPO))
    for f in (REPO / "ext" / "src").glob("*.c"):
        for m in re.finditer(r'getenv\("(ERDMA_[A-Z0-9_]+)"\)', f.read_text()):
            found.setdefault(m.group(1), f.relative_to(REPO))
    return found


def test_every_variable_the_code_reads_is_declared():
    found = _names_read()
    assert len(found) > 40  # the scan itself works
    missing = {n: str(f) for n, f in found.items() if config.declared(n) is None}
    assert not missing, f"declare these in erdmampi/config.py: {missing}"


def _is_environ(node):
    return (isinstance(node, ast.Attribute) and node.attr == "environ"
            and isinstance(node.value, ast.Name) and node.value.id == "os")


def _direct_reads(tree):
    """(line, name) of each os.environ.get/os.getenv/os.environ[...]/``in
    os.environ`` of a literal ERDMA_* name: reads that bypass config.get."""
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            fn = node.func
            if isinstance(fn, ast.Attribute) and (
                    (fn.attr in ("get", "pop") and _is_environ(fn.value)) or fn.attr == "getenv"):
                name = node.args[0].value
        elif (isinstance(node, ast.Subscript) and _is_environ(node.value)
              and isinstance(node.ctx, ast.Load) and isinstance(node.slice, ast.Constant)):
            name = node.slice.value
        elif (isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant)
              and any(_is_environ(c) for c in node.comparators)):
            name = node.left.value
        if isinstance(name, str) and NAME.fullmatch(name):
            yield node.lineno, name


def test_python_reads_variables_only_through_config():
    bypass = []
    for top in ("erdmampi", "launcher", "kernels"):
        for f in (REPO / top).rglob("*.py"):
            if f == REPO / "erdmampi" / "config.py":
                continue
            tree = ast.parse(f.read_text(), str(f))
            bypass += [f"{f.relative_to(REPO)}:{line} {name}" for line, name in _direct_reads(tree)]
    assert not bypass, "read these with erdmampi.config.get: " + ", ".join(bypass)
    planted = ast.parse('import os\nx = os.environ.get("ERDMA_TIMEOUT", "1")\n')
    assert list(_direct_reads(planted)) == [(2, "ERDMA_TIMEOUT")]     # the scan finds one


@pytest.mark.parametrize("text, mode", [("1", "lossless"), ("none", "off"), ("INT8", "int8")])
def test_compress_spellings_agree_with_the_codec(text, mode):
    from erdmampi import compression
    assert config.parse(config.VARS["ERDMA_COMPRESS"], text) == mode
    assert compression.parse_mode(text) == mode


def test_the_engine_reads_no_environment():
    """The C engine gets every setting in erdma_config (parsed by config.py)."""
    calls = [f"{f.name}: {m.group(0)}" for f in (REPO / "ext" / "src").glob("*.c")
             for m in re.finditer(r"\b(secure_)?getenv\s*\([^)]*\)", f.read_text())]
    assert not calls, calls


def test_the_reference_page_is_current():
    page = (REPO / "docs" / "config.md").read_text()
    assert page == config.markdown(), "run: python -m erdmampi.config > docs/config.md"
    for name in ("ERDMA_EAGER_LIMIT", "ERDMA_TIMEOUT", "ERDMA_COMPRESS", "ERDMA_COLL_"):
        assert f"`{name}" in page


@pytest.mark.parametrize("name, text, value", [
    ("ERDMA_EAGER_LIMIT", "64k", 65536), ("ERDMA_EAGER_LIMIT", "1M", 1 << 20),
    ("ERDMA_EAGER_LIMIT", "4096", 4096), ("ERDMA_SHM", "no", False), ("ERDMA_SHM", "1", True),
    ("ERDMA_TIMEOUT", "2.5", 2.5), ("ERDMA_CC", "BBR", "bbr"), ("ERDMA_KEEPALIVE", "0", 0.0),
    ("ERDMA_COLL_ALLREDUCE", "ring", "ring"),
])
def test_values_parse(name, text, value):
    assert config.get(name, {name: text}) == value


@pytest.mark.parametrize("name, text, says", [
    ("ERDMA_EAGER_LIMIT", "64 kilobytes", "a size in bytes"),
    ("ERDMA_SHM", "maybe", "1/0, yes/no, true/false, on/off"),
    ("ERDMA_TIMEOUT", "-1", "a positive number of seconds"),
    ("ERDMA_CC", "vegas", "auto, cubic, reno, bbr, bbr2"),
    ("ERDMA_LANES", "9", "an integer (>= 0, <= 8)"),
    ("ERDMA_EAGER_LIMIT", "1.5", "a size in bytes"),
])
def test_bad_values_name_the_variable_and_what_it_accepts(name, text, says):
    with pytest.raises(config.ConfigError) as info:
        config.get(name, {name: text})
    assert str(info.value).startswith(f"{name}={text!r} is not valid: expected ")
    assert says in str(info.value)


def test_unset_and_empty_give_the_default():
    assert config.get("ERDMA_EAGER_LIMIT", {}) == 65536
    assert config.get("ERDMA_EAGER_LIMIT", {"ERDMA_EAGER_LIMIT": " "}) == 65536
    with pytest.raises(KeyError):
        config.get("ERDMA_NO_SUCH_THING", {})


def test_a_layer_prefers_a_default_and_the_environment_still_wins(monkeypatch):
    monkeypatch.setattr(config, "_PREFERRED", {})
    assert config.get("ERDMA_PACE", env={}) is False
    config.prefer("ERDMA_PACE", True)
    assert config.get("ERDMA_PACE", env={}) is True
    assert config.get("ERDMA_PACE", env={"ERDMA_PACE": "0"}) is False
    assert config.get("ERDMA_PACE", env={}, default=False) is False
    with pytest.raises(KeyError):
        config.prefer("ERDMA_NO_SUCH_THING", 1)


def test_validate_reports_errors_and_unknown_names():
    errors, warnings = config.validate({"ERDMA_SHM": "maybe", "ERDMA_EAGER_LMIT": "1",
                                        "ERDMA_CC": "bbr", "PATH": "/bin"})
    assert errors == ["ERDMA_SHM='maybe' is not valid: expected 1/0, yes/no, true/false, on/off"]
    assert warnings == ["ERDMA_EAGER_LMIT is not an erdmampi variable "
                        "(did you mean ERDMA_EAGER_LIMIT?)"]


def test_erdmarun_checks_before_starting_ranks():
    code = "print('rank started', flush=True)"
    r = subprocess.run(erdmarun_cmd() + ["-n", "2", "--env", "ERDMA_SHM=maybe", sys.executable,
                                         "-c", code], env=rank_env(None), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "ERDMA_SHM='maybe' is not valid" in r.stderr
    assert "rank started" not in r.stdout
    r = subprocess.run(erdmarun_cmd() + ["-n", "1", sys.executable, "-c", code],
                       env=rank_env({"ERDMA_EAGER_LMIT": "1"}), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "warning: ERDMA_EAGER_LMIT is not an erdmampi variable (did you mean " \
           "ERDMA_EAGER_LIMIT?)" in r.stderr


def test_a_rank_refuses_a_bad_value_by_name():
    # a rank started without erdmarun (singleton) checks its own environment
    r = subprocess.run([sys.executable, "-c", "from erdmampi import MPI"],
                       env=rank_env({"ERDMA_TIMEOUT": "soon"}), capture_output=True, text=True,
                       timeout=60, cwd=REPO)
    assert r.returncode != 0
    assert "ERDMA_TIMEOUT='soon' is not valid: expected a positive number of seconds" \
        in r.stderr
