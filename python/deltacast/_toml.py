"""A TOML writer for config dicts (tomllib only reads): tables, arrays of tables
(a list of dicts: [[node]], [[link]]), strings, integers, booleans and lists."""
from __future__ import annotations

from typing import Any, List, Mapping


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"config value {v!r} cannot be written as TOML")


def _is_table_array(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and bool(v) and all(isinstance(x, Mapping) for x in v)


def dumps(config: Mapping[str, Any]) -> str:
    lines: List[str] = []
    for key, value in config.items():
        if not isinstance(value, Mapping) and not _is_table_array(value):
            lines.append(f"{key} = {_value(value)}")
    for key, value in config.items():
        if isinstance(value, Mapping):
            lines.append(f"[{key}]")
            lines.extend(f"{k} = {_value(v)}" for k, v in value.items())
        elif _is_table_array(value):
            for table in value:
                lines.append(f"[[{key}]]")
                lines.extend(f"{k} = {_value(v)}" for k, v in table.items())
    return "\n".join(lines) + "\n"
