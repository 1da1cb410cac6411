"""The documentation holds to what it says of itself (docs/architecture.md,
"Documentation"): every public name has a NumPy-style docstring and a page
of the API reference; no tracked file speaks of how the work on mxamp was
organised; every reference to a docs page names a page, and a section, that
exist; pages stay short; the changelog has the version."""
import importlib
import inspect
import re
import subprocess
from pathlib import Path

import pytest
from sphinx.pycode import ModuleAnalyzer

import mxamp

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
# The public modules: mxamp and those its API reference documents.
MODULES = ("mxamp", "mxamp.quantization", "mxamp.gluon", "mxamp.backends",
           "mxamp.backends.onednn", "mxamp.training", "mxamp.verify", "mxamp.cpu")
LONGEST_PAGE = 400


def public_names(module):
    """`__all__`, else the functions and classes the module itself defines
    whose names do not start with an underscore."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return [name for name, value in vars(module).items()
            if not name.startswith("_") and (inspect.isclass(value) or callable(value))
            and getattr(value, "__module__", None) == module.__name__]


def public_objects():
    """(qualified name, object) of every public name once, then of the
    methods and properties classes define themselves."""
    seen, found = set(), []
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in public_names(module):
            value = getattr(module, name)
            if id(value) in seen:
                continue
            seen.add(id(value))
            found.append((f"{module_name}.{name}", value))
            if inspect.isclass(value) and not issubclass(value, BaseException):
                found += [(f"{module_name}.{name}.{attr}", member)
                          for attr, member in vars(value).items()
                          if not attr.startswith("_") and
                          (inspect.isfunction(member) or isinstance(member, property))]
    return found


def parameters(value):
    """The parameter names a docstring must list (`*args`, `**kwargs` with
    their stars); none for exceptions, enums and properties."""
    if isinstance(value, property) or inspect.ismodule(value) or \
            (inspect.isclass(value) and issubclass(value, (BaseException, mxamp.Category))):
        return []
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return []
    stars = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
    return [stars.get(p.kind, "") + p.name for p in signature.parameters.values()
            if p.name not in ("self", "cls")]


def section(doc, title):
    """The entries of a NumPy docstring section: names of its unindented lines."""
    match = re.search(rf"^{title}\n-+\n(.*?)(?=^\S[^\n]*\n-+\n|\Z)", doc, re.S | re.M)
    if match is None:
        return None
    heads = [line.split(" : ")[0] for line in match.group(1).splitlines()
             if line and not line[0].isspace()]
    return {name.strip() for head in heads for name in head.split(",")}


def attribute_documented(module_name, name):
    """Whether a `#:` comment documents `name` in the module or its package."""
    importlib.import_module(module_name)
    candidates = [module_name] + sorted(m for m in list(importlib.sys.modules)
                                        if m.startswith(module_name + "."))
    for candidate in candidates:
        try:
            docs = ModuleAnalyzer.for_module(candidate).find_attr_docs()
        except Exception:  # a compiled or unreadable module: nothing there
            continue
        if any(key[1] == name and "".join(lines).strip() for key, lines in docs.items()):
            return True
    return False


OBJECTS = public_objects()


@pytest.mark.parametrize("qualname, value", OBJECTS, ids=[name for name, _ in OBJECTS])
def test_public_name_has_a_numpy_docstring(qualname, value):
    if not (inspect.isclass(value) or inspect.isfunction(value) or inspect.ismodule(value)
            or isinstance(value, property) or callable(value)):
        module, _, name = qualname.rpartition(".")
        assert attribute_documented(module, name), f"{qualname}: no #: comment documents it"
        return
    doc = inspect.getdoc(value)
    assert doc, f"{qualname} has no docstring"
    summary = doc.split("\n\n", 1)[0]
    assert summary.endswith("."), f"{qualname}: the summary is one sentence ending in '.'"
    wanted = parameters(value)
    if wanted:
        listed = (section(doc, "Parameters") or set()) | (section(doc, "Attributes") or set())
        assert set(wanted) <= listed, \
            f"{qualname}: Parameters does not list {sorted(set(wanted) - listed)}"


def test_the_convention_check_can_fail():
    """A docstring of another convention is caught."""
    def google_style(x, y=1):
        """Adds.

        Args:
            x: a number.
        """
    assert section(inspect.getdoc(google_style), "Parameters") is None

    def numpy_style(x, *rest, **options):
        """Adds.

        Parameters
        ----------
        x, *rest : float
            Numbers.
        **options
            Ignored.
        """
    assert section(inspect.getdoc(numpy_style), "Parameters") == {"x", "*rest", "**options"}
    assert parameters(numpy_style) == ["x", "*rest", "**options"]


def test_the_api_reference_documents_every_public_module():
    pages = "\n".join(path.read_text() for path in (DOCS / "api").glob("*.md"))
    documented = set(re.findall(r"^\.\. automodule:: (\S+)$", pages, re.M))
    assert documented == set(MODULES)


def tracked_text_files():
    names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        path = ROOT / name
        if path.is_file():
            try:
                yield name, path.read_text()
            except UnicodeDecodeError:
                continue  # binary


# How a file would speak of the work on mxamp rather than of mxamp: a
# numbered stop or issue, a session, the agents. Words, so that "stops at",
# "issues a" or an ONNX Runtime session do not count.
PROCESS = re.compile("|".join([
    r"\bstops? \d+", r"\bissues? #?\d+", r"\bissue's\b", r"\bthe issue\b",
    r"\b(?:this|that|a later|the next|an earlier|the same|next|later|earlier) session\b",
    r"\bsession's\b", r"\bagents?\b", r"\bagents'", r"\bthe lead\b"]), re.I)


def test_no_file_speaks_of_its_own_process():
    here = Path(__file__).relative_to(ROOT).as_posix()
    hits = [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}"
            for name, text in tracked_text_files() if name != here
            for m in PROCESS.finditer(text)]
    assert hits == []


def test_the_process_check_can_fail():
    for text in ("measured in stop 51", "issue 31's targets", "(issue #34)", "this session",
                 "shared with 3 other agents' jobs"):
        assert PROCESS.search(text), text
    for text in ("the pass stops at the first", "an ONNX Runtime session", "issues a warning"):
        assert not PROCESS.search(text), text


def slug(heading):
    """A heading's anchor as MyST (and GitHub) make it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(page):
    return [line.lstrip("#").strip() for line in (DOCS / page).read_text().splitlines()
            if re.match(r"#{1,6} ", line)]


def flat(text):
    return re.sub(r"[\s`]+", " ", re.sub(r"^\s*(?:#|//|\*)\s?", " ", text, flags=re.M)).strip()


def test_every_docs_reference_names_a_page_and_section_that_exist():
    """`docs/PAGE.md`, `docs/PAGE.md, "Section"` and `(docs/PAGE.md#anchor)`
    in any tracked file."""
    # a section's quote follows a comma, colon or space: not the quote that
    # closes a string holding the path
    reference = re.compile(r'docs/(\w+\.md)(?:#([\w-]+)|\)?(?:\'s)?(?:[,:]|\s)(?:\s*(?:#|//|\*)?)*'
                           r'\s*"([^"]+)")?')
    here = Path(__file__).relative_to(ROOT).as_posix()  # its docstrings show the forms
    missing = []
    for name, text in tracked_text_files():
        if name == here:
            continue
        for m in reference.finditer(text):
            page, anchor, quoted = m.groups()
            if not (DOCS / page).is_file():
                missing.append(f"{name}: docs/{page}")
            elif anchor and anchor not in {slug(h) for h in headings(page)}:
                missing.append(f"{name}: docs/{page}#{anchor}")
            elif quoted and not any(flat(quoted).lower() in flat(h).lower()
                                    for h in headings(page)):
                missing.append(f"{name}: docs/{page}, {quoted!r}")
    assert missing == []


def test_pages_are_short():
    long = {path.name: n for path in DOCS.rglob("*.md")
            if (n := len(path.read_text().splitlines())) > LONGEST_PAGE}
    assert long == {}


def test_the_changelog_has_this_version():
    assert f"\n## {mxamp.__version__}\n" in (ROOT / "CHANGELOG.md").read_text()
