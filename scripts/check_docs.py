"""The docs check (scripts/test.sh runs it; exit 1 on any failure):

  python3 scripts/check_docs.py ALPHA_NATIVE      (a built alpha-native binary)

1. Every relative link in README.md and docs/*.md resolves: the file exists, and an anchor
   (`file.md#some-heading`, `#some-heading`) names a heading of that file, as GitHub spells
   anchors.
2. `alpha-native --help` and every command's `--help` exit 0.
3. Every command in the README's `sh` blocks runs and exits 0, in order, in a scratch
   directory holding the repository's `data/` (so later commands find what earlier ones
   wrote), `alpha-native` being the binary given, except those that need what this machine
   may lack: a GPU (`--backend gpu`, `cuda` or `auto`),
   MPI (`mpirun`), a model in the Hugging Face cache (`gpt2`), a port (`--serve`), or a
   build (`cargo`, `scripts/`). Each is given 120 s.

Needs nothing beyond Python 3.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + [os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs"))) if f.endswith(".md")]
# What a README command needs that CI may not have, and why it is not run here.
NEEDS = [("--backend gpu", "a GPU"), ("--backend cuda", "an NVIDIA GPU"), ("--backend auto", "a GPU"), ("mpirun", "MPI"), ("gpt2", "a model in the Hugging Face cache"),
         ("--serve", "a port"), ("cargo ", "a build"), ("scripts/", "a build"), ("npm ", "a build")]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```(\w*)\s*$")


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces `-`."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(path):
    """The anchors of a Markdown file's headings (outside code blocks)."""
    out, fenced = set(), False
    for line in open(path, encoding="utf-8"):
        if FENCE.match(line.strip()):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(slug(line.lstrip("#")))
    return out


def check_links():
    """Broken relative links, as messages."""
    bad = []
    for doc in DOCS:
        path = os.path.join(ROOT, doc)
        text = open(path, encoding="utf-8").read()
        text = re.sub(r"```.*?```", "", text, flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(dest):
                bad.append(f"{doc}: link to {target}: no file {os.path.relpath(dest, ROOT)}")
            elif anchor and dest.endswith(".md") and anchor not in headings(dest):
                bad.append(f"{doc}: link to {target}: {os.path.relpath(dest, ROOT)} has no heading #{anchor}")
    return bad


def readme_commands():
    """The shell lines of the README's `sh` blocks, comments cut."""
    out, block = [], None
    for line in open(os.path.join(ROOT, "README.md"), encoding="utf-8"):
        fence = FENCE.match(line.strip())
        if fence:
            block = None if block is not None else fence.group(1)
            continue
        command = re.sub(r"(^|\s+)#.*$", "", line.strip())
        if block == "sh" and command:
            out.append(command)
    return out


def run(command, cwd, env):
    """Runs `command` in bash: (exit status, seconds, the last lines of its output)."""
    start = time.time()
    try:
        p = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        code, output = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        code, output = "timeout", ""
    return code, time.time() - start, "\n".join(output.strip().splitlines()[-3:])


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    binary = os.path.abspath(sys.argv[1])
    failed = check_links()
    scratch = tempfile.mkdtemp(prefix="alpha-docs-")
    try:
        bin_dir = os.path.join(scratch, "bin")
        os.makedirs(bin_dir)
        os.symlink(binary, os.path.join(bin_dir, "alpha-native"))
        work = os.path.join(scratch, "work")
        shutil.copytree(os.path.join(ROOT, "data"), os.path.join(work, "data"))
        env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ["PATH"], ALPHA_CACHE_DIR=os.path.join(scratch, "cache"))
        help_text = subprocess.run([binary, "--help"], capture_output=True, text=True).stdout
        commands = re.findall(r"^  (\w+)  ", help_text.split("Commands:", 1)[-1], re.M)
        helps = ["alpha-native --help"] + [f"alpha-native {c} --help" for c in commands if c != "help"]
        for command in helps + readme_commands():
            need = next((why for key, why in NEEDS if key in command), None)
            if need:
                print(f"skipped ({need}): {command}")
                continue
            code, seconds, tail = run(command, work, env)
            print(f"{'ok' if code == 0 else 'FAILED'} ({seconds:.1f} s): {command}")
            if code != 0:
                failed.append(f"README command exited {code}: {command}\n{tail}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for f in failed:
        print(f"error: {f}")
    if failed:
        sys.exit(1)
    print(f"docs: {len(DOCS)} files' links resolve; every README command that runs here exits 0")


if __name__ == "__main__":
    main()
