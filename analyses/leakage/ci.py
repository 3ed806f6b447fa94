"""The leakage audit in the formats CI systems read: SARIF 2.1.0 (code-scanning UIs show each leak
on the line where it appears) and JUnit XML (one test case per check).

Both render a `LeakageReport` as it is; nothing is parsed back. In SARIF each leak kind is one
result located at its origin (`origin.Origin`): the op's own line, or, when that lies in
an installed library, the first line in the user's files, the op then a related location.
"""
from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from interp.analyses.leakage.origin import Frame, Origin
from interp.analyses.leakage.report import LeakageReport, describe_row
from interp.analyses.leakage.types import above_threshold

SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
RULES: dict[str, tuple[str, str]] = {  # leak kind -> (rule name, what the rule checks)
    "future": ("FutureLeak", "An output position depends on a later token (a causal model must read only the past)."),
    "batch": ("BatchMixing", "An example's outputs depend on the other examples of its batch."),
    "padding": ("PaddingLeak", "Real positions depend on the content of the padding."),
    "incomplete": ("CheckNotRun", "A check the model calls for (padding, for a model taking an attention_mask) could not run."),
}


def _tool_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("interp-attention")
    except PackageNotFoundError:
        return "0"


def _location(frame: Frame, root: Path, message: str | None = None) -> dict[str, Any]:
    path = Path(frame.file)
    try:
        uri, base = path.resolve().relative_to(root).as_posix(), {"uriBaseId": "SRCROOT"}
    except ValueError:
        uri, base = path.resolve().as_uri(), {}
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
    if origin is not None:
        text += f". First at {origin.op}: {origin.detail}" + (f" ({origin.mask})" if origin.mask else "")
    result: dict[str, Any] = {"ruleId": f"leak/{kind}", "level": "error", "message": {"text": text},
                              "properties": {"max_influence": _number(report.max_influence)}}
    if origin is not None:
        shown = origin.user_frame or origin.frame
        result["locations"] = [_location(shown, root)]
        if origin.user_frame is not None:
            result["relatedLocations"] = [{"id": 1, **_location(origin.frame, root, f"the op: {origin.op}")}]
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
            "tool": {"driver": {"name": "interp audit-leakage", "version": _tool_version(), "rules": rules}},
            "originalUriBaseIds": {"SRCROOT": {"uri": root.as_uri() + "/"}},
            "invocations": [{"executionSuccessful": True, "exitCode": report.exit_code}],
            "results": results,
        }],
    }


def to_junit(report: LeakageReport, suite: str) -> str:
    """The report as JUnit XML: one test case per check (method), failed where it found a leak,
    skipped where it did not run; an extra failed case per check the model called for that could not run."""
    cases = ET.Element("testsuite", name=suite)
    failures = skipped = 0
    for row in report.summary_rows():
        case = ET.SubElement(cases, "testcase", classname="interp.audit_leakage", name=row["method"])
        if row["status"] == "skipped":
            ET.SubElement(case, "skipped", message="not run for this model")
            skipped += 1
        elif row["status"] == "leak":
            ET.SubElement(case, "failure", message=f"{row['method']}: max influence {row['max_influence']:.3g} at "
                          f"{row['where']}").text = _failure_text(report, row["method"])
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


def _failure_text(report: LeakageReport, method: str) -> str:
    from interp.analyses.leakage.types import METHOD_KIND

    rows = report.table[(report.table["method"] == method)]
    rows = rows[above_threshold(rows, report.tol)].nlargest(3, "influence")
    lines = [describe_row(row) for _, row in rows.iterrows()]
    origin = report.origins.get(METHOD_KIND[method])
    if origin is not None:
        lines.append(f"origin: {origin}")
    return "\n".join(lines)
