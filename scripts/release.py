#!/usr/bin/env python3
"""Release chores: one version everywhere, release notes, the chart package, upgrade safety.

    scripts/release.py version [--tag vX.Y.Z]   print the version; exit 1 naming every place
                                                that disagrees (with --tag, the tag too)
    scripts/release.py bump X.Y.Z [--date D]    move every place to X.Y.Z and CHANGELOG.md's
                                                Unreleased entries under [X.Y.Z] - D
    scripts/release.py notes X.Y.Z              print CHANGELOG.md's entries for X.Y.Z
    scripts/release.py package-chart DIR --image-repository REPO
                                                charts/laneway as DIR/laneway-X.Y.Z.tgz whose
                                                default image is REPO:X.Y.Z
    scripts/release.py upgrade-check --from-ref REF | --from-dir DIR | --previous-release
                                                what `helm upgrade` from that chart would break

The release workflow (.github/workflows/release.yml) calls each of these; tests/test_release.py
runs them all. Needs Python 3.11+ and PyYAML; package-chart and upgrade-check need helm.
"""

from __future__ import annotations

import argparse
import datetime
import io
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CHART = Path("charts/laneway")
CRD = Path("crds/laneway.io_inferencepools.yaml")
CHART_CRD = CHART / "crds" / CRD.name
INSTALL = Path("manifests/install/laneway.yaml")
CHANGELOG = Path("CHANGELOG.md")
VERSION_LABEL = "app.kubernetes.io/version"
# Semantic versioning as Helm and OCI tags accept it: no leading "v", no build metadata ("+"
# is not allowed in an image tag).
SEMVER = re.compile(r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?")
RELEASE_HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?\s*$")
UNRELEASED = "Unreleased"
# The one line of values.yaml that names the image, and where the package's version lives.
IMAGE_REPOSITORY_LINE = re.compile(r"^(image:\n  repository: ).*$", re.MULTILINE)
INIT_VERSION = re.compile(r'^__version__ = "(?P<v>[^"]*)"$', re.MULTILINE)
API_VERSION = re.compile(r'^VERSION = "(?P<v>[^"]*)"$', re.MULTILINE)


class ReleaseError(Exception):
    """A problem the release must not go on with; the message says what to change."""


# --- one version ---------------------------------------------------------------------------


def read_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def one_match(pattern: re.Pattern[str], text: str, where: Path) -> re.Match[str]:
    matches = list(pattern.finditer(text))
    if len(matches) != 1:
        raise ReleaseError(f"{where}: expected one line matching {pattern.pattern!r}")
    return matches[0]


def changelog_sections(text: str) -> list[tuple[str, str | None, str]]:
    """(version, date, body) for each `## [...]` section of a Keep a Changelog file, in order."""
    sections: list[tuple[str, str | None, str]] = []
    lines: list[str] = []
    for line in text.splitlines():
        heading = RELEASE_HEADING.match(line)
        if heading:
            sections.append((heading["version"], heading["date"], ""))
            lines = []
        elif line.startswith("## "):
            raise ReleaseError(f"{CHANGELOG}: {line!r} is not '## [X.Y.Z] - YYYY-MM-DD'")
        elif sections and not re.match(r"^\[[^\]]+\]: ", line):  # link references end it
            lines.append(line)
            version, date, _ = sections[-1]
            sections[-1] = (version, date, "\n".join(lines).strip())
    return sections


def versions_in_tree(root: Path) -> dict[str, str]:
    """Every place that states laneway's version -> the version it states."""
    found: dict[str, str] = {}
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    found["pyproject.toml project.version"] = project["version"]
    init = root / "laneway" / "__init__.py"
    found["laneway/__init__.py __version__"] = one_match(
        INIT_VERSION, init.read_text(encoding="utf-8"), init
    )["v"]
    chart = read_yaml(root / CHART / "Chart.yaml")
    found[f"{CHART}/Chart.yaml version"] = str(chart["version"])
    found[f"{CHART}/Chart.yaml appVersion"] = str(chart["appVersion"])
    tag = read_yaml(root / CHART / "values.yaml")["image"]["tag"]
    # An empty tag is the chart's appVersion (templates/_helpers.tpl "laneway.image").
    if tag:
        found[f"{CHART}/values.yaml image.tag"] = str(tag)
    for crd in (CRD, CHART_CRD):
        labels = read_yaml(root / crd)["metadata"].get("labels", {})
        found[f"{crd} label {VERSION_LABEL}"] = str(labels.get(VERSION_LABEL))
    for document in yaml.safe_load_all((root / INSTALL).read_text(encoding="utf-8")):
        labels = (document or {}).get("metadata", {}).get("labels", {})
        if VERSION_LABEL in labels:
            name = f"{document['kind']} {document['metadata']['name']}"
            found[f"{INSTALL} {name} label {VERSION_LABEL}"] = str(labels[VERSION_LABEL])
    released = [
        s
        for s in changelog_sections((root / CHANGELOG).read_text(encoding="utf-8"))
        if s[0] != UNRELEASED
    ]
    found[f"{CHANGELOG} newest release"] = released[0][0] if released else "(none)"
    return found


def api_version_problems(root: Path) -> list[str]:
    """The CRD must store the version laneway's API model speaks, and serve every version
    an example or the chart writes."""
    api = root / "laneway" / "api" / "names.py"
    version = one_match(API_VERSION, api.read_text(encoding="utf-8"), api)["v"]
    crd = read_yaml(root / CRD)
    group = crd["spec"]["group"]
    served = {v["name"] for v in crd["spec"]["versions"] if v["served"]}
    stored = [v["name"] for v in crd["spec"]["versions"] if v["storage"]]
    problems = []
    if stored != [version]:
        problems.append(f"{CRD} stores {stored}, laneway/api/names.py speaks {version}")
    users = sorted((root / "manifests" / "examples").glob("*.yaml"))
    users += sorted((root / CHART / "templates").glob("*.yaml"))
    for path in users:
        for written in re.findall(rf"apiVersion: {re.escape(group)}/(\S+)", path.read_text()):
            if written not in served:
                problems.append(f"{path.relative_to(root)} writes {group}/{written}, not served")
    return problems


def check_version(root: Path, tag: str | None) -> str:
    found = versions_in_tree(root)
    version = found["pyproject.toml project.version"]
    problems = [f"{place} is {value}" for place, value in found.items() if value != version]
    if not SEMVER.fullmatch(version):
        problems.append(f"{version} is not a semantic version X.Y.Z[-pre]")
    problems += api_version_problems(root)
    if tag is not None and tag != f"v{version}":
        problems.append(f"tag {tag} is not v{version}")
    if problems:
        raise ReleaseError(
            f"version {version} (pyproject.toml) disagrees with:\n  " + "\n  ".join(problems)
        )
    if tag is not None:
        release_notes(root, version)  # a tag needs its CHANGELOG entries
    return version


# --- bump ----------------------------------------------------------------------------------


def replace_one(path: Path, pattern: str, replacement: str) -> None:
    text = path.read_text(encoding="utf-8")
    new, count = re.subn(pattern, replacement, text, count=0, flags=re.MULTILINE)
    if count != 1:
        raise ReleaseError(f"{path}: expected one match of {pattern!r}, found {count}")
    path.write_text(new, encoding="utf-8")


def bump(root: Path, version: str, date: str) -> None:
    if not SEMVER.fullmatch(version):
        raise ReleaseError(f"{version} is not a semantic version X.Y.Z[-pre]")
    changelog = root / CHANGELOG
    sections = changelog_sections(changelog.read_text(encoding="utf-8"))
    if not sections or sections[0][0] != UNRELEASED:
        raise ReleaseError(f"{CHANGELOG}: the first section must be [{UNRELEASED}]")
    if not sections[0][2]:
        raise ReleaseError(f"{CHANGELOG}: [{UNRELEASED}] is empty: nothing to release")
    if any(s[0] == version for s in sections):
        raise ReleaseError(f"{CHANGELOG} already has [{version}]")
    replace_one(root / "pyproject.toml", r'^version = "[^"]*"$', f'version = "{version}"')
    replace_one(
        root / "laneway" / "__init__.py", INIT_VERSION.pattern, f'__version__ = "{version}"'
    )
    replace_one(root / CHART / "Chart.yaml", r"^version: .*$", f"version: {version}")
    replace_one(root / CHART / "Chart.yaml", r"^appVersion: .*$", f'appVersion: "{version}"')
    replace_one(root / CRD, rf"^(    {VERSION_LABEL}): .*$", rf'\1: "{version}"')
    replace_one(
        changelog,
        rf"^## \[{UNRELEASED}\]$",
        f"## [{UNRELEASED}]\n\n## [{version}] - {date}",
    )
    # The chart's copy of the CRD and manifests/install/ follow from the chart.
    subprocess.run(["bash", str(root / "scripts" / "gen-manifests.sh")], check=True, timeout=120)
    check_version(root, None)


# --- release notes -------------------------------------------------------------------------


def release_notes(root: Path, version: str) -> str:
    for name, date, body in changelog_sections((root / CHANGELOG).read_text(encoding="utf-8")):
        if name == version:
            if date is None:
                raise ReleaseError(f"{CHANGELOG}: [{version}] has no date (## [X.Y.Z] - Y-M-D)")
            if not body:
                raise ReleaseError(f"{CHANGELOG}: [{version}] has no entries")
            return body
    raise ReleaseError(f"{CHANGELOG} has no [{version}] section: run scripts/release.py bump")


# --- the chart package ---------------------------------------------------------------------


def find_helm(root: Path) -> str:
    helm = shutil.which("helm") or str(root / ".tools" / "bin" / "helm")
    if not Path(helm).is_file():
        raise ReleaseError("helm is not on PATH nor in .tools/bin: run scripts/install-tools.sh")
    return helm


def run_helm(helm: str, *args: str) -> str:
    result = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise ReleaseError(f"helm {' '.join(args)}: {result.stderr.strip() or result.stdout}")
    return result.stdout


def package_chart(root: Path, destination: Path, image_repository: str) -> Path:
    """The chart as released: its default image is the one this release pushed."""
    version = check_version(root, None)
    if not re.fullmatch(
        r"[a-z0-9]+(?:[._/-][a-z0-9]+)*(?::\d+)?(?:/[a-z0-9._-]+)*", image_repository
    ):
        raise ReleaseError(f"--image-repository {image_repository!r}: not a lowercase image name")
    helm = find_helm(root)
    with tempfile.TemporaryDirectory() as work:
        chart = Path(work) / "laneway"
        shutil.copytree(root / CHART, chart)
        values = chart / "values.yaml"
        text, count = IMAGE_REPOSITORY_LINE.subn(rf"\g<1>{image_repository}", values.read_text())
        if count != 1:
            raise ReleaseError(f"{CHART}/values.yaml: no 'image:' block starting with repository")
        values.write_text(text)
        run_helm(helm, "lint", "--strict", str(chart))
        destination.mkdir(parents=True, exist_ok=True)
        run_helm(helm, "package", str(chart), "--destination", str(destination))
    package = destination / f"laneway-{version}.tgz"
    if not package.is_file():
        raise ReleaseError(f"helm package did not write {package}")
    return package


# --- upgrade safety ------------------------------------------------------------------------


@dataclass(frozen=True)
class Rendered:
    """What one chart version installs: its templates rendered, and its crds/."""

    objects: list[dict[str, Any]]
    crds: dict[str, dict[str, Any]]  # CRD name -> document


def render(helm: str, chart: Path, values: Sequence[Path]) -> Rendered:
    args = ["template", "laneway", str(chart), "--namespace", "laneway"]
    for path in values:
        args += ["--values", str(path)]
    objects = [d for d in yaml.safe_load_all(run_helm(helm, *args)) if d]
    crds = {}
    for path in sorted((chart / "crds").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document:
                crds[document["metadata"]["name"]] = document
    return Rendered(objects=objects, crds=crds)


def key(manifest: dict[str, Any]) -> tuple[str, str]:
    return manifest["kind"], manifest["metadata"]["name"]


def upgrade_problems(old: Rendered, new: Rendered) -> list[str]:
    """What `helm upgrade` from `old` to `new` would lose or fail on."""
    problems = []
    for manifest in new.objects:
        if manifest["kind"] == "CustomResourceDefinition":
            # A templated CRD is deleted with the release, and every InferencePool with it.
            problems.append(f"CRD {manifest['metadata']['name']} is templated; keep it in crds/")
    for name, crd in old.crds.items():
        if name not in new.crds:
            problems.append(
                f"CRD {name} left crds/: Helm would not delete it, but nothing ships it"
            )
            continue
        versions = {v["name"]: v for v in new.crds[name]["spec"]["versions"]}
        for version in crd["spec"]["versions"]:
            after = versions.get(version["name"])
            if version["served"] and not (after and after["served"]):
                problems.append(
                    f"CRD {name} stops serving {version['name']}: clients and stored objects "
                    "of that version break; serve it (deprecated) for at least one release"
                )
    pools_before = {key(m) for m in old.objects if m["kind"] == "InferencePool"}
    pools_after = {key(m) for m in new.objects if m["kind"] == "InferencePool"}
    for _, name in sorted(pools_before - pools_after):
        problems.append(
            f"InferencePool {name} is no longer rendered: helm upgrade deletes it and the "
            "operator its engines"
        )
    deployments_before = {key(m): m for m in old.objects if m["kind"] == "Deployment"}
    for manifest in new.objects:
        before = deployments_before.get(key(manifest))
        if before and before["spec"]["selector"] != manifest["spec"]["selector"]:
            problems.append(
                f"Deployment {manifest['metadata']['name']}: spec.selector changed, which "
                "Kubernetes refuses (immutable field): helm upgrade would fail"
            )
    return problems


def chart_at_ref(root: Path, ref: str, destination: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", "--format=tar", ref, str(CHART)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    if archive.returncode != 0:
        raise ReleaseError(f"git archive {ref}: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(destination, filter="data")
    return destination / CHART


def previous_release(root: Path) -> str | None:
    """The newest tag vX.Y.Z below the version in the tree, or None before any release."""
    version = check_version(root, None)
    tags = subprocess.run(
        ["git", "-C", str(root), "tag", "--list", "v*"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()

    def number(text: str) -> tuple[int, ...]:
        return tuple(int(part) for part in text.split("-")[0].split("."))

    earlier = [t for t in tags if SEMVER.fullmatch(t[1:]) and number(t[1:]) < number(version)]
    return max(earlier, key=lambda t: number(t[1:])) if earlier else None


def upgrade_check(root: Path, old_chart: Path, values: Sequence[Path]) -> list[str]:
    helm = find_helm(root)
    return upgrade_problems(render(helm, old_chart, values), render(helm, root / CHART, values))


# --- command line --------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="scripts/release.py", description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    commands = parser.add_subparsers(dest="command", required=True)
    version = commands.add_parser("version", help="print the version; fail where places differ")
    version.add_argument("--tag", help="the release tag, which must be v<version>")
    bumping = commands.add_parser("bump", help="move every place to a new version")
    bumping.add_argument("version")
    bumping.add_argument("--date", default=datetime.date.today().isoformat())
    notes = commands.add_parser("notes", help="print CHANGELOG.md's entries for a version")
    notes.add_argument("version")
    package = commands.add_parser("package-chart", help="package the chart for a release")
    package.add_argument("destination", type=Path)
    package.add_argument("--image-repository", required=True)
    upgrade = commands.add_parser("upgrade-check", help="what helm upgrade would lose or fail on")
    source = upgrade.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-ref", help="the chart at this git ref (a tag, a commit)")
    source.add_argument("--from-dir", type=Path, help="the chart in this folder")
    source.add_argument("--previous-release", action="store_true", help="the newest tag before")
    upgrade.add_argument("--values", type=Path, action="append", default=[])
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    root: Path = args.root
    try:
        if args.command == "version":
            print(check_version(root, args.tag))
        elif args.command == "bump":
            bump(root, args.version, args.date)
            print(f"release: bumped to {args.version}; review and commit", file=sys.stderr)
        elif args.command == "notes":
            print(release_notes(root, args.version))
        elif args.command == "package-chart":
            print(package_chart(root, args.destination, args.image_repository))
        else:
            with tempfile.TemporaryDirectory() as work:
                if args.from_dir:
                    old, source = args.from_dir, str(args.from_dir)
                else:
                    ref = args.from_ref or previous_release(root)
                    if ref is None:
                        print(
                            "release: no earlier release tag; nothing to compare", file=sys.stderr
                        )
                        return 0
                    old, source = chart_at_ref(root, ref, Path(work)), ref
                problems = upgrade_check(root, old, args.values)
            if problems:
                raise ReleaseError(f"helm upgrade from {source}:\n  " + "\n  ".join(problems))
            print(
                f"release: helm upgrade from {source} keeps every pool and the CRD", file=sys.stderr
            )
    except ReleaseError as error:
        print(f"release: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
