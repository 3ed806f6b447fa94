"""The leakage audit in the formats CI systems read: SARIF 2.1.0 (code-scanning UIs show each leak
on the line where it appears) and JUnit XML (one test case per check).

Both render a `LeakageReport` as it is; nothing is parsed back. In SARIF each leak kind is one
result located at its origin (`origin.Origin.location`): the line that built the mask or positions
the leaking op consumed, else the op's own line, or, when that lies in an installed library, the
first line in the user's files; the op's line is then a related location. An origin with no line of
model code (the op ran inside torch's own modules) has no location, only its message. URIs are
relative to the working folder and percent-encoded ("my models #1/x.py" -> "my%20models%20%231/x.py").

When the audit could not run (bad input, a model that fails or ends the process), `sarif_failure`
and `junit_failure` write the same files with the error instead of a verdict, so a CI step that
uploads them (`if: always()`) finds them on every exit code.
"""
from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any
from urllib.parse import quote

from interp.analyses.leakage.origin import Frame, Origin
from interp.analyses.leakage.report import LeakageReport, describe_row
from interp.analyses.leakage.types import above_threshold

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
RULES: dict[str, tuple[str, str]] = {  # leak kind -> (rule name, what the rule checks)
    "future": ("FutureLeak", "An output position depends on a later token (a causal model must read only the past)."),
    "batch": ("BatchMixing", "An example's outputs depend on the other examples of its batch."),
    "padding": ("PaddingLeak", "Real positions depend on the content of the padding."),
    "document": ("DocumentLeak", "A packed document reads another document, or is cut by an over-eager mask (over-masked)."),
    "kv_cache": ("KVCacheLeak", "Prefill then decode with the KV cache differs from the full forward, or a decode call "
                 "reads its own later tokens."),
    "window": ("WindowLeak", "A sliding-window layer lets a query see more than its W keys (or a later one)."),
    "backend": ("BackendLeak", "Attention implementations disagree, or one of them breaks a contract the others keep."),
    "incomplete": ("CheckNotRun", "A check the model calls for (padding, for a model taking an attention_mask) could not run."),
}


def _tool_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("interp-attention")
    except PackageNotFoundError:
        return "0"


def artifact_uri(file: str, root: Path) -> tuple[str, dict[str, str]]:
    """A file as a SARIF artifact URI: relative to `root` and percent-encoded (with the base id SRCROOT), else an
    absolute file URI."""
    path = Path(file).resolve()
    try:
        return quote(path.relative_to(root).as_posix(), safe="/"), {"uriBaseId": "SRCROOT"}
    except ValueError:
        return path.as_uri(), {}


def _location(frame: Frame, root: Path, message: str | None = None) -> dict[str, Any]:
    uri, base = artifact_uri(frame.file, root)
    location: dict[str, Any] = {
        "physicalLocation": {"artifactLocation": {"uri": uri, **base},
                             "region": {"startLine": max(frame.line, 1), "snippet": {"text": frame.code}}},
        "logicalLocations": [{"fullyQualifiedName": frame.function, "kind": "function"}],
    }
    if message:
        location["message"] = {"text": message}
    return location


def _result(report: LeakageReport, kind: str, origin: Origin | None, root: Path) -> dict[str, Any]:
    text = f"{RULES[kind][0]}: {report.headline}"
    contract = report.contracts.get(kind)
    if contract is not None:
        text += f". {contract.where}"
    if origin is not None:
        text += f". First at {origin.op}: {origin.detail}" + (f" ({origin.mask})" if origin.mask else "")
        if origin.built_by is not None:
            text += f"; it consumed the {origin.built_by}" + (", built at the location" if origin.built else "")
        if origin.location is None:
            text += (". No line of model code: the op ran inside torch or a library the model calls, so the result "
                     "has no location")
    biggest = report.max_influence if contract is None else contract.max_influence
    result: dict[str, Any] = {"ruleId": f"leak/{kind}", "level": "error", "message": {"text": text},
                              "properties": {"max_influence": _number(biggest)}}
    if contract is not None:
        result["properties"].update({"floor": _number(contract.floor), "found": list(contract.found)})
    if origin is not None:
        shown = origin.location
        if shown is not None:
            result["locations"] = [_location(shown, root)]
        related = [(frame, words) for frame, words in ((origin.frame, f"the op: {origin.op}"),
                                                       (origin.user_frame, "called from here"))
                   if frame is not None and frame is not shown]
        if related:
            result["relatedLocations"] = [{"id": i, **_location(frame, root, words)} for i, (frame, words) in enumerate(related, 1)]
        result["properties"].update({"op": origin.op, "influence": _number(origin.influence)})
    return result


def _number(value: float) -> float | None:
    return None if value is None or math.isnan(value) or math.isinf(value) else float(value)


def to_sarif(report: LeakageReport, root: Path | None = None) -> dict[str, Any]:
    """The report as a SARIF 2.1.0 log: one result per leak kind (and per check that could not run)."""
    root = (root or Path.cwd()).resolve()
    results = [_result(report, kind, report.origins.get(kind), root) for kind in report.leaks]
    results += [{"ruleId": "leak/incomplete", "level": "error", "message": {"text": reason}}
                for reason in report.incomplete.values()]
    rules = [{"id": f"leak/{kind}", "name": name, "shortDescription": {"text": words},
              "defaultConfiguration": {"level": "error"}} for kind, (name, words) in RULES.items()]
    return {
        "$schema": SARIF_SCHEMA, "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": TOOL, "version": _tool_version(), "rules": rules}},
            "originalUriBaseIds": {"SRCROOT": {"uri": root.as_uri() + "/"}},
            "invocations": [{"executionSuccessful": True, "exitCode": report.exit_code}],
            "results": results,
        }],
    }


def to_junit(report: LeakageReport, suite: str) -> str:
    """The report as JUnit XML: one test case per check (method, then contract: `document`, `window`...), failed
    where it found a leak,
    skipped where it did not run; an extra failed case per check the model called for that could not run."""
    cases = ET.Element("testsuite", name=suite)
    failures = skipped = 0
    for row in report.summary_rows():
        case = ET.SubElement(cases, "testcase", classname="interp.audit_leakage", name=row["method"])
        if row["status"] in ("skipped", "not applicable"):
            ET.SubElement(case, "skipped", message="not run for this model" if row["status"] == "skipped" else
                          f"not applicable: {row['where']}")
            skipped += 1
        elif row["status"] == "leak":
            ET.SubElement(case, "failure", message=f"{row['method']}: max influence {row['max_influence']:.3g} at "
                          f"{row['where']}").text = _failure_text(report, row["method"])
            failures += 1
        elif row["status"] == "weight above diagonal" and not report.bidirectional:  # expected causal: not a pass
            ET.SubElement(case, "failure", message=f"pattern: attention weight {row['max_influence']:.3g} on a later "
                          f"key at {row['where']} (a causal model puts exactly 0 there)").text = _failure_text(report, "pattern")
            failures += 1
    for check, reason in report.incomplete.items():
        case = ET.SubElement(cases, "testcase", classname="interp.audit_leakage", name=f"{check} (required)")
        ET.SubElement(case, "failure", message=reason)
        failures += 1
    cases.set("tests", str(len(cases)))
    cases.set("failures", str(failures))
    cases.set("skipped", str(skipped))
    cases.set("time", f"{report.seconds:.3f}")
    root = ET.Element("testsuites", name="interp", tests=cases.get("tests", "0"), failures=str(failures))
    root.append(cases)
    ET.indent(root)
    return xml_safe(ET.tostring(root, encoding="unicode", xml_declaration=True)) + "\n"


# what XML 1.0 forbids in a document: C0 controls but tab, newline and carriage return; surrogates; U+FFFE, U+FFFF
_XML_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_safe(text: str) -> str:
    """`text` with every character XML 1.0 forbids written as its visible escape (ESC -> `\\x1b`), so a model
    spec or message holding one (a path with a control character) still gives a well-formed JUnit file."""
    return _XML_FORBIDDEN.sub(lambda match: ascii(match.group())[1:-1], text)


TOOL = "interp audit-leakage"


def sarif_failure(error_type: str, message: str, exit_code: int, root: Path | None = None) -> dict[str, Any]:
    """A SARIF 2.1.0 log for an audit that did not run: no results, `executionSuccessful: false`, the error as a
    tool execution notification."""
    root = (root or Path.cwd()).resolve()
    notification = {"level": "error", "message": {"text": message}, "descriptor": {"id": error_type}}
    return {
        "$schema": SARIF_SCHEMA, "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {"name": TOOL, "version": _tool_version()}},
            "originalUriBaseIds": {"SRCROOT": {"uri": root.as_uri() + "/"}},
            "invocations": [{"executionSuccessful": False, "exitCode": exit_code,
                             "toolExecutionNotifications": [notification]}],
            "results": [],
        }],
    }


def junit_failure(suite: str, error_type: str, message: str) -> str:
    """JUnit XML for an audit that did not run: one test case, `audit`, in error."""
    cases = ET.Element("testsuite", name=suite, tests="1", failures="0", errors="1", skipped="0", time="0.000")
    case = ET.SubElement(cases, "testcase", classname="interp.audit_leakage", name="audit")
    ET.SubElement(case, "error", type=error_type, message=message).text = message
    root = ET.Element("testsuites", name="interp", tests="1", failures="0", errors="1")
    root.append(cases)
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _failure_text(report: LeakageReport, method: str) -> str:
    from interp.analyses.leakage.types import METHOD_KIND

    if method in report.contracts:
        contract = report.contracts[method]
        lines = [f.words() for f in (contract.first(kind) for kind in contract.found) if f is not None]
        lines += [f"floor {contract.floor:.3g} ({contract.dtype}), threshold {contract.threshold:.3g}"]
        if contract.origin is not None:
            lines.append(f"origin: {contract.origin}")
        return "\n".join(lines)
    rows = report.table[(report.table["method"] == method)]
    rows = rows[above_threshold(rows, report.tol)].nlargest(3, "influence")
    lines = [describe_row(row) for _, row in rows.iterrows()]
    origin = report.origins.get(METHOD_KIND[method])
    if origin is not None:
        lines.append(f"origin: {origin}")
    return "\n".join(lines)
