"""Untrusted YAML and the values error messages quote: an alias bomb is refused before it expands, and a
message never grows with the input (issue: hostile files)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from invariants.idi import IdiRuleError, IdiRuleSet
from invariants.untrusted import REPR_LIMIT, YamlAliasError, bounded_repr, safe_load_yaml

FUZZ = Path(__file__).parents[1] / "fuzz"
BOMB = FUZZ / "idi" / "alias-bomb.yaml"


def test_plain_yaml_loads_as_safe_load_does() -> None:
    assert safe_load_yaml("a: [1, 2.5, x]\nb: {c: null}\n") == {"a": [1, 2.5, "x"], "b": {"c": None}}


@pytest.mark.parametrize("text", ["a: &x 1\nb: 2\n", "a: 1\nb: *x\n", "a: &x [1]\nb: *x\n", "- &x {k: v}\n"])
def test_anchors_and_aliases_are_refused(text: str) -> None:
    with pytest.raises(YamlAliasError, match="anchors and aliases are not allowed"):
        safe_load_yaml(text)


def test_python_tags_stay_refused() -> None:
    import yaml

    with pytest.raises(yaml.YAMLError):
        safe_load_yaml('a: !!python/object/apply:os.system ["true"]\n')


def test_bounded_repr_cuts_long_values() -> None:
    assert bounded_repr("short") == "'short'"
    long = "x" * 10_000_000
    out = bounded_repr(long)
    assert len(out) <= REPR_LIMIT + 1 and out.startswith("'xxx")
    assert bounded_repr(list(range(10_000))) == "<list of 10000 items>"
    assert len(bounded_repr({"k": "v" * 500})) < REPR_LIMIT + 40


def test_idi_alias_bomb_fails_fast_under_a_memory_limit() -> None:
    """495 bytes that expand to 387 million strings: refused in a process limited to 1.5 GB of address
    space (the old loader expanded the value into the error message and ran out of memory)."""
    code = textwrap.dedent(
        f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (1_500_000_000, 1_500_000_000))
        from invariants.idi import IdiRuleError, IdiRuleSet
        try:
            IdiRuleSet.from_yaml(open({str(BOMB)!r}, encoding="utf-8").read(), ["0", "1"])
        except IdiRuleError as exc:
            print("refused:", exc)
            sys.exit(0)
        sys.exit(1)
        """
    )
    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, cwd=Path.cwd()
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "anchors and aliases are not allowed" in out.stdout
    assert len(out.stdout) < 300


def test_idi_messages_quote_bounded_values() -> None:
    rules = "rules:\n  - name: " + "n" * 100_000 + "\n    when: {field: f, bogus: 1}\n    allowed_labels: [0]\n"
    with pytest.raises(IdiRuleError) as info:
        IdiRuleSet.from_yaml(rules, ["0", "1"])
    assert len(str(info.value)) < 400


def test_audit_yaml_arguments_refuse_aliases(tmp_path: Path) -> None:
    from agent.audits.kinds import read_yaml
    from agent.errors import UserError

    spec = tmp_path / "spec.yaml"
    spec.write_text("a: &x [1, 2]\nb: *x\n", encoding="utf-8")
    for source in (str(spec), "[&t {name: shift}, *t]"):
        with pytest.raises(UserError, match="anchors and aliases are not allowed"):
            read_yaml(source, "--spec")
    assert read_yaml("[{name: shift}]", "--transformations") == [{"name": "shift"}]
