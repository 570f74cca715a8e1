"""Pinned versions read from a project's manifests, and whether a version range is possible."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from lintdist.versions import Versions, project_versions


def _project(tmp_path, files: dict[str, str]):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / ".git").mkdir()
    (tmp_path / "src").mkdir(exist_ok=True)
    (tmp_path / "src" / "train.py").write_text("")
    return project_versions(tmp_path / "src" / "train.py")


def test_requirements_with_includes_and_comments(tmp_path):
    versions = _project(
        tmp_path,
        {
            "requirements.txt": "-r requirements/base.txt\naccelerate>=1.2,<1.6  # FSDP1\n-e .\n",
            "requirements/base.txt": "torch==2.5.1\nTransformers[torch] >=4.46 ; python_version >= '3.9'\n",
        },
    )
    assert versions.allows("accelerate", ">=1.6") is False
    assert versions.allows("accelerate", ">=1.5") is True
    assert versions.allows("torch", "<2.6") is True
    assert versions.allows("transformers", ">=5") is True
    assert versions.allows("peft", ">=0.10") is None  # nothing declared: unknown


def test_pyproject_groups_and_target_versions_override(tmp_path):
    versions = _project(
        tmp_path,
        {
            "pyproject.toml": '[project]\nname = "x"\ndependencies = ["transformers>=4.40"]\n'
            '[project.optional-dependencies]\ntrain = ["deepspeed==0.15.*"]\n'
            '[tool.lintdist]\ntarget-versions = { transformers = ">=4.46,<5" }\n'
        },
    )
    assert versions.allows("transformers", ">=5") is False
    assert versions.allows("deepspeed", ">=0.15.4,<0.16") is True
    assert versions.allows("deepspeed", ">=0.16") is False


def test_setup_files_conda_and_locks(tmp_path):
    setup = "REQUIRES = ['accelerate<1.0', 'datasets']\nsetup(name='x', install_requires=REQUIRES)\n"
    assert _project(tmp_path / "a", {"setup.py": setup}).allows("accelerate", ">=1.0") is False
    cfg = "[options]\ninstall_requires =\n    lightning>=2.2\n    pytorch-lightning>=2.1\n"
    assert _project(tmp_path / "b", {"setup.cfg": cfg}).allows("lightning", "<2.2") is False
    conda = "dependencies:\n  - pytorch=2.1\n  - pip:\n    - accelerate==1.7.0\n"
    versions = _project(tmp_path / "c", {"environment.yml": conda})
    assert versions.allows("torch", ">=2.1.2,<2.2") is True and versions.allows("torch", ">=2.2") is False
    assert versions.allows("accelerate", ">=1.6") is True
    lock = 'version = 1\n[[package]]\nname = "accelerate"\nversion = "1.5.2"\n'
    assert (
        _project(
            tmp_path / "d", {"pyproject.toml": '[project]\ndependencies = ["accelerate>=1"]\n', "uv.lock": lock}
        ).allows("accelerate", ">=1.6")
        is False
    )


def test_no_manifest_above_the_repository_root_is_read(tmp_path):
    (tmp_path / "requirements.txt").write_text("accelerate<1.6\n")
    repository = tmp_path / "repo"
    (repository / ".git").mkdir(parents=True)
    (repository / "train.py").write_text("")
    assert project_versions(repository / "train.py") == Versions()


def test_ld301_is_silent_where_the_pinned_accelerate_predates_fsdp2(lintdist, tmp_path):
    config = "distributed_type: FSDP\nfsdp_config:\n  fsdp_version: 2\n  fsdp_use_orig_params: true\n"
    (tmp_path / ".git").mkdir()
    (tmp_path / "config.yaml").write_text(config)
    (tmp_path / "requirements.txt").write_text("accelerate==1.5.2\n")
    assert lintdist("check", "--no-cache", "--select", "LD301", str(tmp_path / "config.yaml")).exit_code == 0
    (tmp_path / "requirements.txt").write_text("accelerate==1.6.0\n")
    assert "LD301" in lintdist("check", "--no-cache", "--select", "LD301", str(tmp_path / "config.yaml")).output


CLAUSE = st.builds(
    lambda op, release: f"{op}{'.'.join(map(str, release))}",
    st.sampled_from([">=", "<=", "==", "!=", ">", "<"]),
    st.lists(st.integers(0, 3), min_size=1, max_size=3),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(CLAUSE, min_size=1, max_size=3), st.lists(CLAUSE, min_size=1, max_size=2))
def test_plain_bounds_are_decided_as_packaging_decides_them(ours, theirs):
    # The fast path for plain release bounds gives packaging's answer (probed at every bound and beside it).
    versions = Versions({"torch": (",".join(ours), "pyproject.toml")})
    from lintdist import versions as module

    fast = module._simple_meet(f"{','.join(ours)},{','.join(theirs)}")
    assert fast is not None
    original = module._simple_meet
    module._simple_meet = lambda _: None  # the packaging path
    try:
        assert versions.allows("torch", ",".join(theirs)) == fast
    finally:
        module._simple_meet = original


def test_anything_but_plain_bounds_goes_to_packaging():
    from lintdist.versions import _simple_meet

    assert _simple_meet(">=2.2,<3") is True
    assert _simple_meet(">=2.2,<2.2") is False
    assert _simple_meet(">=2.2,<=2.2.0,!=2.2") is False
    assert _simple_meet("~=2.2") is None
    assert _simple_meet("==2.*") is None
    assert _simple_meet(">=2.2rc1") is None
