#!/usr/bin/env python3
"""The report of scripts/bench-regions: reads its work folder (publish reports, tc and
CPU snapshots, agents' logs, bytes per parameter of synthetic steps), writes
bench/results/regions.json with `measured` (this run) and `projection` (the paper's
table, every cell computed from measured ratios and labelled as projection), and two
PNG plots (gnuplot, else matplotlib). With --path bucket or both: `measured.bucket`
(the same publishes through the object store, with the bridges' S3 requests per
refit from their logs) and, for both, `tree_vs_bucket` (ratios within this run).
Standard library only, plus the plotter."""
import argparse
import datetime
import glob
import json
import os
import re
import shutil
import subprocess
import sys

# The paper (NeMo-DCR): 1T parameters at 3 % change through a relay tree in 150 s,
# against 87.5 min for the full BF16 checkpoint; 12-40 x over 30B-1T at 3 % and 5 %.
PAPER_1T_FULL_SECONDS = 87.5 * 60
PAPER_1T_DELTA_SECONDS = 150.0
PAPER_SPEEDUP_RANGE = (12, 40)
# The WAN rate that 87.5 min implies for 2 TB (1T BF16 parameters), as one stream.
PAPER_WAN_BPS = 2e12 * 8 / PAPER_1T_FULL_SECONDS
REGIONS = ["train", "euw", "aps", "usw"]
MODELS = [("30B", 30e9), ("70B", 70e9), ("235B", 235e9), ("671B", 671e9), ("1T", 1e12)]

LOG_LINE = re.compile(r"^(\S+) \w+ (\S+): refit (\d+)[: ](.*)$")


def stamp(text):
    return datetime.datetime.fromisoformat(text).timestamp()


def read_float(path):
    with open(path) as f:
        return float(f.read().strip())


def snapshot(path):
    wan, cpu = {}, {}
    for line in open(path):
        parts = line.split()
        if parts[0] == "wan" and len(parts) == 4 and parts[3]:
            wan[(int(parts[1]), parts[2])] = int(parts[3])
        elif parts[0] == "cpu" and len(parts) == 3:
            cpu[parts[1]] = float(parts[2])
    return wan, cpu


def refit_id(work, name):
    path = os.path.join(work, name + ".refit")  # written as printed: a u64 jq would round
    return open(path).read().strip() or None if os.path.exists(path) else None


def timeline(work, refit, start, logs="logs"):
    """Per node: seconds after the publish call of its first chunk, END, PREPARED and
    commit, from the agents' logs."""
    marks = {}
    for path in glob.glob(os.path.join(work, logs, "*.log")):
        for line in open(path, errors="replace"):
            m = LOG_LINE.match(line.strip())
            if not m or m.group(3) != refit:
                continue
            t, node, rest = stamp(m.group(1)) - start, m.group(2), m.group(4).strip()
            entry = marks.setdefault(node, {})
            if rest.startswith("first chunk"):
                entry.setdefault("first_chunk", t)
            elif rest.startswith("END received"):
                entry.setdefault("last_chunk", t)
            elif rest.startswith("prepared"):
                entry.setdefault("prepared", t)
            elif rest.startswith("committed"):
                entry["committed"] = t
    return marks


def serving_pauses(work, report, nodes_by_region, refit_seconds):
    """What each node's engine stopped for (docs/serving.md), from the publish's node
    reports: per node its apply mode, pause (staged: the commit's write; on-arrival:
    the first write to the commit), hold and write time; per region the longest pause
    of each mode, against the refit time and the on-arrival nodes' write time (the
    apply itself, same delta and hardware)."""
    modes = {}
    path = os.path.join(work, "apply_modes.txt")
    if os.path.exists(path):
        for line in open(path):
            node, mode = line.split()
            modes[node] = mode
    by_node = {n["node"]: n for n in report.get("nodes", [])}
    out = {"nodes": {}, "regions": {}}
    for node, n in by_node.items():
        out["nodes"][node] = {"apply": modes.get(node, "on-arrival"),
                              "pause_seconds": n.get("pause_seconds"),
                              "prepared_hold_seconds": n.get("prepared_hold_seconds"),
                              "write_seconds": n.get("write_seconds")}
    for region, nodes in nodes_by_region.items():
        def longest(mode, key="pause_seconds"):
            vals = [out["nodes"][n][key] for n in nodes
                    if n in out["nodes"] and out["nodes"][n]["apply"] == mode
                    and out["nodes"][n][key] is not None]
            return max(vals) if vals else None
        staged, arrival, write = longest("staged"), longest("on-arrival"), longest(
            "on-arrival", "write_seconds")
        out["regions"][region] = {
            "staged_pause_seconds": staged, "on_arrival_pause_seconds": arrival,
            "on_arrival_write_seconds": write,
            "staged_pause_over_refit": staged / refit_seconds if staged is not None else None,
            "staged_pause_over_apply": staged / write if staged is not None and write else None,
            "meets_pause_le_0_1_refit": staged <= 0.1 * refit_seconds if staged is not None
            else None,
            "meets_pause_le_apply_plus_10pct": staged <= 1.1 * write
            if staged is not None and write else None}
    return out


def measure_publish(work, name, wan_links, nodes_by_region, slowest_wan_bps, logs="logs"):
    report = json.load(open(os.path.join(work, name + ".json")))
    start = read_float(os.path.join(work, name + ".start"))
    end = read_float(os.path.join(work, name + ".end"))
    before_wan, before_cpu = snapshot(os.path.join(work, name + ".before"))
    after_wan, after_cpu = snapshot(os.path.join(work, name + ".after"))
    rid = refit_id(work, name)
    marks = timeline(work, rid, start, logs) if rid else {}
    wan_bytes = {}
    for k, region in wan_links.items():
        into = after_wan.get((k, "into"), 0) - before_wan.get((k, "into"), 0)
        out = after_wan.get((k, "out"), 0) - before_wan.get((k, "out"), 0)
        wan_bytes[region] = {"into_region": into, "out_of_region": out}
    regions = {}
    for region, nodes in nodes_by_region.items():
        times = [marks[n] for n in nodes if n in marks]
        def latest(key):
            vals = [t[key] for t in times if key in t]
            return max(vals) if vals else None
        def earliest(key):
            vals = [t[key] for t in times if key in t]
            return min(vals) if vals else None
        regions[region] = {"first_chunk": earliest("first_chunk"), "last_chunk": latest("last_chunk"),
                           "prepared": latest("prepared"), "committed": latest("committed")}
    delta = report.get("delta_bytes", 0)
    wall = end - start
    pauses = serving_pauses(work, report, nodes_by_region, wall)
    exact_path = os.path.join(work, name + ".exact")
    out = {
        "committed": report.get("committed"),
        "abort_reason": report.get("abort_reason", ""),
        "nodes_decided": report.get("nodes_decided"),
        "delta_bytes": delta,
        "checkpoint_bytes": report.get("checkpoint_bytes"),
        "refit_seconds": wall,
        "source_seconds": report.get("seconds"),
        "first_chunk_seconds": report.get("call_to_first_chunk_seconds"),
        "pipeline_efficiency": wall / (delta * 8 / slowest_wan_bps) if delta else None,
        "wan_bytes": wan_bytes,
        "region_times": regions,
        "cpu_seconds": {n: round(after_cpu.get(n, 0) - before_cpu.get(n, 0), 3) for n in after_cpu},
        "pause_seconds": pauses,
    }
    if os.path.exists(exact_path):
        out["bit_exact"] = read_float(exact_path) == 1
    return out


def plot(out, measured, projection, run_params):
    """Two PNGs beside `out`, named after it (regions.json: regions_*.png)."""
    gnuplot = shutil.which("gnuplot")
    results_dir = os.path.dirname(os.path.abspath(out))
    stem = os.path.splitext(os.path.basename(out))[0]
    size_png = os.path.join(results_dir, stem + "_refit_vs_size.png")
    timeline_png = os.path.join(results_dir, stem + "_timeline.png")
    data = os.path.join(results_dir, "." + stem + "_plot.dat")
    with open(data, "w") as f:
        f.write("# params full_s fast3 context3 fast5 context5 (projection, paper WAN rate)\n")
        for row in projection["rows_paper_rate"]:
            f.write(f"{row['params']} {row['full_seconds']} {row['fast_3_seconds']} "
                    f"{row['context_3_seconds']} {row['fast_5_seconds']} {row['context_5_seconds']}\n")
        f.write("\n\n")
        m = measured["runs"]
        f.write(f"{run_params} {m['full']['refit_seconds']} {m['fast']['refit_seconds']} "
                f"{m['context']['refit_seconds']}\n")
        f.write("\n\n")
        regions = list(m["fast"]["region_times"].items())
        region_block = "".join(
            f"{i} \"{region}\" {t['first_chunk'] or 0} {t['last_chunk'] or 0} "
            f"{t['prepared'] or 0} {t['committed'] or 0}\n" for i, (region, t) in enumerate(regions))
        f.write(region_block + "\n\n")
        for row in projection["rows_run_rate"]:
            f.write(f"{row['params']} {row['full_deltacast_literal_seconds']} "
                    f"{row['fast_3_seconds']} {row['context_3_seconds']}\n")
    if gnuplot:
        script = f"""
set terminal pngcairo size 900,560 noenhanced
set output '{size_png}'
set logscale xy
set xlabel 'parameters'
set ylabel 'refit time (s)'
set key top left font ',9'
set title 'Refit time against model size (lines: projections; points: measured here)'
plot '{data}' index 0 using 1:2 with linespoints title 'full checkpoint (projection)', \\
     '' index 0 using 1:3 with linespoints title 'delta 3% fast (projection)', \\
     '' index 0 using 1:4 with linespoints title 'delta 3% context (projection)', \\
     '' index 0 using 1:5 with linespoints title 'delta 5% fast (projection)', \\
     '' index 1 using 1:2 with points pt 7 ps 2 title 'full, measured here', \\
     '' index 1 using 1:3 with points pt 9 ps 2 title 'delta fast, measured here', \\
     '' index 1 using 1:4 with points pt 5 ps 2 title 'delta context, measured here', \\
     '' index 3 using 1:2 with lines dt 2 title 'full (literal records), this run WAN (projection)', \\
     '' index 3 using 1:3 with lines dt 2 title 'delta 3% fast, this run WAN (projection)'
set output '{timeline_png}'
unset logscale
set xlabel 'seconds after the publish call'
set ylabel ''
set ytics ({', '.join(f'"{r}" {i}' for i, (r, _) in enumerate(regions))})
set yrange [-1:{len(regions)}]
set title 'One delta refit (fast mode) by region: first chunk, last chunk, prepared, committed'
plot '{data}' index 2 using 3:1 with points pt 7 ps 2 title 'first chunk', \\
     '' index 2 using 4:1 with points pt 5 ps 2 title 'last chunk', \\
     '' index 2 using 5:1 with points pt 9 ps 2 title 'prepared', \\
     '' index 2 using 6:1 with points pt 13 ps 2 title 'committed'
"""
        subprocess.run([gnuplot], input=script, text=True, check=True)
        os.remove(data)
        return [size_png, timeline_png]
    print("regions_report: no gnuplot; plots skipped", file=sys.stderr)
    return []


def serving_summary(runs, params):
    """Per delta kind: the longest staged and on-arrival pause of any node, against the
    refit time and the on-arrival write time (docs/serving.md)."""
    out = {}
    for name in ("full", "fast", "context"):
        regions = runs[name]["pause_seconds"]["regions"].values()
        def most(key):
            vals = [r[key] for r in regions if r[key] is not None]
            return max(vals) if vals else None
        staged, arrival, write = (most("staged_pause_seconds"), most("on_arrival_pause_seconds"),
                                  most("on_arrival_write_seconds"))
        refit = runs[name]["refit_seconds"]
        out[name] = {"refit_seconds": refit, "staged_pause_seconds": staged,
                     "on_arrival_pause_seconds": arrival, "on_arrival_write_seconds": write,
                     "staged_pause_over_refit": staged / refit if staged is not None else None,
                     "on_arrival_pause_over_refit": arrival / refit if arrival is not None else None,
                     "staged_pause_over_apply": staged / write if staged is not None and write
                     else None,
                     "checkpoint_bytes": runs[name]["checkpoint_bytes"]}
    return out


def pause_projection(serving, projection):
    """The pause of a 1T model's staged refit from this run's measured write rate (one
    host thread per node here; an engine's GPUs write faster), next to the projected
    refit time at the paper's WAN rate."""
    fast = serving["fast"]
    if not fast["staged_pause_seconds"]:
        return None
    rate = fast["checkpoint_bytes"] / fast["staged_pause_seconds"]  # B of checkpoint per s
    refit = next((r["fast_3_seconds"] for r in projection["rows_paper_rate"] if r["model"] == "1T"),
                 None)
    pause = 2e12 / rate
    return {"label": "projection: a 1T BF16 model's staged pause at this run's measured write "
                     "rate (checkpoint bytes per second of pause, one apply thread on the host)",
            "write_rate_bytes_per_second": rate, "pause_seconds": pause,
            "refit_seconds_paper_rate": refit,
            "pause_over_refit": pause / refit if refit else None}


def tree_report(a):
    """The tree path's runs (publishes full, fast, context, fault, after_fault), the
    projection and the plots; printed as it goes."""
    wan_mbit, wan_ms, regions = a.wan_mbit_list, a.wan_ms_list, REGIONS
    plan = json.load(open(os.path.join(a.work, "plan.json")))
    nodes_by_region = {}
    for n in plan["nodes"]:
        if n["role"] != "source":
            nodes_by_region.setdefault(n["region"], []).append(n["id"])
    slowest_bps = min(wan_mbit) * 1e6
    runs = {name: measure_publish(a.work, name, dict(enumerate(regions)), nodes_by_region,
                                  slowest_bps)
            for name in ("full", "fast", "context", "fault", "after_fault")}
    # FP8 serving weights (docs/fp8.md): step3's twin -> step4's, fast, every node.
    if os.path.exists(os.path.join(a.work, "fp8.json")):
        runs["fp8"] = measure_publish(a.work, "fp8", dict(enumerate(regions)), nodes_by_region,
                                      slowest_bps, logs="logs-fp8")
    killed = read_float(os.path.join(a.work, "fault.killed")) if os.path.exists(
        os.path.join(a.work, "fault.killed")) else None
    fault_start = read_float(os.path.join(a.work, "fault.start"))
    caught = None
    for line in open(os.path.join(a.work, "logs", a.gateway + ".log"), errors="replace"):
        m = re.match(r"^(\S+) \w+ \S+: caught up to .* in ([0-9.]+) s", line)
        if m:
            caught = float(m.group(2))
    params = float(a.params.rstrip("MBG")) * {"M": 1e6, "B": 1e9, "G": 1e9}.get(a.params[-1], 1)
    bpp = {}
    for line in open(os.path.join(a.work, "bytes_per_param.txt")):
        r, mode, size = line.split()
        bpp[(int(r), mode)] = int(size) / 50e6
    eff = runs["fast"]["pipeline_efficiency"]
    eff_context = runs["context"]["pipeline_efficiency"]
    eff_full = runs["full"]["pipeline_efficiency"]
    # Refit time against wire time at the slowest WAN, over this run's three clean
    # publishes: T = fixed + stream * wire. `fixed` is what latency costs (round
    # trips of the handshake, PREPARED and COMMIT across the WAN, process work);
    # `stream` how close to the wire the pipeline streams (1.0: at the wire's rate).
    points = [(runs[n]["delta_bytes"] * 8 / slowest_bps, runs[n]["refit_seconds"])
              for n in ("full", "fast", "context")]
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    stream = (sum((x - mx) * (y - my) for x, y in points) /
              max(sum((x - mx) ** 2 for x, _ in points), 1e-12))
    fixed = max(my - stream * mx, 0.0)
    full_bpp = runs["full"]["delta_bytes"] / params  # literal records of this checkpoint

    def rows(wan_bps, label, models=MODELS):
        out = []
        for name, n in models:
            raw = 2 * n * 8 / wan_bps  # the paper's baseline: the BF16 checkpoint as is
            row = {"model": name, "params": n, "wan_gbps": wan_bps / 1e9, "label": label,
                   "full_seconds": raw,
                   "full_deltacast_literal_seconds": fixed + stream * full_bpp * n * 8 / wan_bps}
            for r in (3, 5):
                for mode in ("fast", "context"):
                    t = fixed + stream * bpp[(r, mode)] * n * 8 / wan_bps
                    row[f"{mode}_{r}_seconds"] = t
                    row[f"{mode}_{r}_speedup"] = raw / t
            if (3, "fp8_fast") in bpp:  # the FP8 twin's delta, per BF16 parameter
                t = fixed + stream * bpp[(3, "fp8_fast")] * n * 8 / wan_bps
                row["fp8_fast_3_seconds"] = t
                row["fp8_fast_3_speedup"] = raw / t
            out.append(row)
        return out

    projection = {
        "label": "projection: refit = fixed + stream x (measured bytes per parameter x model size"
                 " / WAN rate), fixed and stream fitted to this run's publishes; full = the raw"
                 " BF16 checkpoint over the same WAN (the paper's baseline); not measured at"
                 " these sizes",
        "paper_wan_gbps_inferred": PAPER_WAN_BPS / 1e9,
        "paper_wan_rate_reason": "87.5 min for the 1T BF16 checkpoint (2 TB) is 2e12 B * 8 / 5250 s",
        "bytes_per_param": {f"{r}%_{m}": v for (r, m), v in sorted(bpp.items())},
        "full_literal_bytes_per_param": full_bpp,
        "fit": {"fixed_seconds": fixed, "stream_factor": stream, "points": points},
        "paper": {"1T_3%_relay_tree_seconds": PAPER_1T_DELTA_SECONDS,
                  "1T_full_seconds": PAPER_1T_FULL_SECONDS,
                  "speedup_range_30B_1T": list(PAPER_SPEEDUP_RANGE)},
        "rows_paper_rate": rows(PAPER_WAN_BPS, "projection at the paper's WAN rate"),
        "rows_run_rate": rows(slowest_bps, "projection at this run's slowest WAN rate",
                              [("this run", params)] + MODELS),
    }
    measured = {
        "config": {"params": params, "rate": a.rate, "wan_mbit": wan_mbit, "wan_one_way_ms": wan_ms,
                   "intra_mbit": float(a.intra_mbit), "nodes_per_region": int(a.per_region),
                   "regions": regions},
        "tree": {n["id"]: n["parent"] for n in plan["nodes"]},
        "runs": runs,
        "speedup_fast_over_full": runs["full"]["refit_seconds"] / runs["fast"]["refit_seconds"],
        "speedup_context_over_full": runs["full"]["refit_seconds"] / runs["context"]["refit_seconds"],
        "fault": {
            "gateway": a.gateway,
            "killed_after_seconds": (killed - fault_start) if killed else None,
            "refit_committed_without_it": runs["fault"]["committed"],
            "refit_seconds": runs["fault"]["refit_seconds"],
            "next_refit_seconds": runs["after_fault"]["refit_seconds"],
            "gateway_catch_up_seconds": caught,
            "cost_seconds_vs_a_clean_fast_refit":
                runs["after_fault"]["refit_seconds"] - runs["fast"]["refit_seconds"],
        },
    }
    if "fp8" in runs:
        fp8, bf16 = runs["fp8"], runs["after_fault"]  # the same step, 3 -> 4
        measured["fp8"] = {
            "label": "step3 -> step4 as FP8 serving twins (fp8_e4m3_block128), fast mode, every "
                     "node restarted on step3's twin; against the BF16 publish of the same step",
            "fp8_delta_bytes": fp8["delta_bytes"], "bf16_delta_bytes": bf16["delta_bytes"],
            "fp8_over_bf16_delta": fp8["delta_bytes"] / bf16["delta_bytes"]
            if bf16["delta_bytes"] else None,
            "fp8_checkpoint_bytes": fp8["checkpoint_bytes"],
            "refit_seconds": fp8["refit_seconds"], "bf16_refit_seconds": bf16["refit_seconds"],
            "committed": fp8["committed"], "bit_exact": fp8.get("bit_exact", False),
        }
    measured["serving"] = serving_summary(runs, params)
    projection["pause_1T"] = pause_projection(measured["serving"], projection)
    bit_exact = all(runs[n].get("bit_exact", False)
                    for n in ("full", "fast", "context", "after_fault") + (("fp8",) if "fp8" in runs
                                                                           else ()))
    result = {"benchmark": "regions", "bit_exact": bit_exact, "measured": measured,
              "projection": projection}
    plots = plot(a.out, measured, projection, params)
    print(f"regions: bit_exact={bit_exact}; full {runs['full']['refit_seconds']:.2f} s, fast "
          f"{runs['fast']['refit_seconds']:.2f} s, context {runs['context']['refit_seconds']:.2f} s; "
          f"pipeline efficiency fast {eff:.2f}, context {eff_context:.2f}, full {eff_full:.2f}; "
          f"fit {fixed:.2f} s + {stream:.2f} x wire; plots {', '.join(plots) or 'none'}; {a.out}")
    if "fp8" in measured:
        f8 = measured["fp8"]
        print(f"fp8: step3 -> step4 twins, fast: delta {f8['fp8_delta_bytes']} B against BF16 "
              f"{f8['bf16_delta_bytes']} B ({f8['fp8_over_bf16_delta']:.3f}), refit "
              f"{f8['refit_seconds']:.2f} s (BF16 {f8['bf16_refit_seconds']:.2f} s), "
              f"bit_exact={f8['bit_exact']}")
    print("\nserving pause (longest of any node; staged: the commit's write, on-arrival: first "
          "write to commit):")
    for name, v in measured["serving"].items():
        fmt = lambda x: "-" if x is None else f"{x:.3f}s"
        print(f"  {name:>7}: refit {v['refit_seconds']:.2f}s, staged {fmt(v['staged_pause_seconds'])}"
              f", on-arrival {fmt(v['on_arrival_pause_seconds'])}, on-arrival write "
              f"{fmt(v['on_arrival_write_seconds'])}")
    print("\nprojection at the paper's WAN rate "
          f"({PAPER_WAN_BPS / 1e9:.2f} Gbit/s; every cell a projection):")
    print(f"{'model':>6} {'full':>10} {'3% fast':>10} {'3% ctx':>10} {'5% fast':>10} {'5% ctx':>10}"
          f" {'x 3% fast':>9} {'x 5% fast':>9} {'3% FP8':>10} {'x 3% FP8':>9}")
    for row in projection["rows_paper_rate"]:
        fp8_cells = (f" {row['fp8_fast_3_seconds']:>9.1f}s {row['fp8_fast_3_speedup']:>8.1f}x"
                     if "fp8_fast_3_seconds" in row else f" {'-':>10} {'-':>9}")
        print(f"{row['model']:>6} {row['full_seconds']:>9.0f}s {row['fast_3_seconds']:>9.1f}s "
              f"{row['context_3_seconds']:>9.1f}s {row['fast_5_seconds']:>9.1f}s "
              f"{row['context_5_seconds']:>9.1f}s {row['fast_3_speedup']:>8.1f}x "
              f"{row['fast_5_speedup']:>8.1f}x{fp8_cells}")
    print("(full: the raw BF16 checkpoint at that rate; speedups against it; 3% FP8: the FP8"
          " serving twins' fast delta, per BF16 parameter, docs/fp8.md)")
    print(f"paper: 1T at 3 %: {PAPER_1T_DELTA_SECONDS:.0f} s vs {PAPER_1T_FULL_SECONDS:.0f} s full; "
          f"{PAPER_SPEEDUP_RANGE[0]}-{PAPER_SPEEDUP_RANGE[1]} x over 30B-1T")
    return result


def bucket_requests(work, refit):
    """Per bridge half: the S3 requests it made for refit `refit` (its log line at the
    refit's end counts them since the last one ended, idle polls included)."""
    out = {}
    pattern = re.compile(r"bucket (uplink|downlink) (\S+): refit (\d+): requests (.*)$")
    for path in glob.glob(os.path.join(work, "logs-bucket", "*.log")):
        for line in open(path, errors="replace"):
            m = pattern.search(line.strip())
            if not m or m.group(3) != refit:
                continue
            counts = dict(kv.split("=") for kv in m.group(4).split())
            out[f"{m.group(2)}.{m.group(1)}"] = {k: float(v) if "." in v else int(v)
                                                 for k, v in counts.items()}
    return out


def bucket_report(a, tree):
    """The bucket path's runs (the same publishes full, fast, context) and, when the
    tree ran too, the ratios of the two within this run."""
    plan = json.load(open(os.path.join(a.work, "plan-bucket.json")))
    bridges = set(plan["objstore"]["bridges"]) if plan.get("objstore") else set()
    nodes_by_region = {}
    for n in plan["nodes"]:
        if n["role"] != "source" and n["id"] not in bridges:
            nodes_by_region.setdefault(n["region"], []).append(n["id"])
    slowest_bps = min(a.wan_mbit_list) * 1e6
    runs = {}
    for name in ("full", "fast", "context"):
        run = measure_publish(a.work, "bucket_" + name, dict(enumerate(REGIONS)), nodes_by_region,
                              slowest_bps, logs="logs-bucket")
        rid = refit_id(a.work, "bucket_" + name)
        run["s3_requests"] = bucket_requests(a.work, rid) if rid else {}
        run["s3_requests_total"] = sum(
            v.get("total", 0) for v in run["s3_requests"].values())
        runs[name] = run
    bucket = {"placement": "s3rver in its own namespace in the trainer's region; one uplink per"
                           " inference region beside the trainer; one downlink per region on its"
                           " gateway's host, reading across that region's shaped WAN link"
                           " through the delay proxy",
              "tree": {n["id"]: n["parent"] for n in plan["nodes"]},
              "runs": runs}
    out = {"bucket": bucket,
           "bit_exact": all(runs[n].get("bit_exact", False) for n in runs)}
    if tree:
        t = tree["measured"]["runs"]
        cmp = {}
        for name in ("full", "fast", "context"):
            def wan_total(run, key):
                return sum(v[key] for r, v in run["wan_bytes"].items() if r != "train")
            row = {"tree_refit_seconds": t[name]["refit_seconds"],
                   "bucket_refit_seconds": runs[name]["refit_seconds"],
                   "bucket_over_tree_seconds": runs[name]["refit_seconds"] / t[name]["refit_seconds"],
                   "delta_bytes": runs[name]["delta_bytes"],
                   "tree_wan_bytes_into_regions": wan_total(t[name], "into_region"),
                   "bucket_wan_bytes_into_regions": wan_total(runs[name], "into_region"),
                   "tree_wan_bytes_out_of_regions": wan_total(t[name], "out_of_region"),
                   "bucket_wan_bytes_out_of_regions": wan_total(runs[name], "out_of_region"),
                   "bucket_s3_requests": runs[name]["s3_requests_total"]}
            row["bucket_over_tree_wan_bytes"] = (
                (row["bucket_wan_bytes_into_regions"] + row["bucket_wan_bytes_out_of_regions"]) /
                (row["tree_wan_bytes_into_regions"] + row["tree_wan_bytes_out_of_regions"]))
            for region in REGIONS[1:]:
                for path, run in (("tree", t[name]), ("bucket", runs[name])):
                    row.setdefault("committed_by_region", {}).setdefault(region, {})[path] = \
                        run["region_times"].get(region, {}).get("committed")
            cmp[name] = row
        out["tree_vs_bucket"] = cmp
    print(f"bucket path: bit_exact={out['bit_exact']}; " + "; ".join(
        f"{n} {runs[n]['refit_seconds']:.2f} s ({runs[n]['s3_requests_total']} S3 requests)"
        for n in runs))
    for n, row in out.get("tree_vs_bucket", {}).items():
        print(f"  {n}: tree {row['tree_refit_seconds']:.2f} s, bucket {row['bucket_refit_seconds']:.2f} s"
              f" ({row['bucket_over_tree_seconds']:.2f} x); WAN bytes into regions tree "
              f"{row['tree_wan_bytes_into_regions']:,}, bucket {row['bucket_wan_bytes_into_regions']:,}"
              f" ({row['bucket_over_tree_wan_bytes']:.3f} x, both directions)")
    return out


def main():
    ap = argparse.ArgumentParser()
    for flag in ("--work", "--out", "--params", "--rate", "--wan-mbit", "--wan-ms", "--intra-mbit",
                 "--per-region", "--gateway"):
        ap.add_argument(flag, required=True)
    ap.add_argument("--path", default="tree", choices=("tree", "bucket", "both"))
    ap.add_argument("--uplink-mbit", default="0")
    ap.add_argument("--flow-mbit", default="0")
    ap.add_argument("--gateways", default="0")
    ap.add_argument("--senders", default="0")
    ap.add_argument("--stripes", default="")
    ap.add_argument("--stripes-only", default="0")
    ap.add_argument("--command", default="", help="the run's command line and date, as recorded")
    a = ap.parse_args()
    a.wan_mbit_list = [float(x) for x in a.wan_mbit.split(",")]
    a.wan_ms_list = [float(x) for x in a.wan_ms.split(",")]
    result = {"benchmark": "regions", "path": a.path}
    tree = tree_report(a) if a.path != "bucket" and a.stripes_only != "1" else None
    if tree:
        result.update(tree)
    if a.stripes:
        sys.dont_write_bytecode = True  # no __pycache__ left in bench/
        from regions_stripes import stripes_report  # it imports this module's helpers
        striped = stripes_report(a)
        result.update(striped)
        result["bit_exact"] = (result.get("bit_exact", True) and not striped["stripes_failed"] and
                               all(r["bit_exact"] for r in striped["stripes"]))
    if a.path != "tree":
        b = bucket_report(a, tree)
        result.setdefault("measured", {})["bucket"] = b["bucket"]
        if "tree_vs_bucket" in b:
            result["tree_vs_bucket"] = b["tree_vs_bucket"]
        result["bit_exact"] = result.get("bit_exact", True) and b["bit_exact"]
    if a.command:
        result["stripes_command" if a.stripes_only == "1" else "command"] = a.command
    if a.stripes_only == "1" and os.path.exists(a.out):
        # A striped run alone keeps what a full run wrote there (measured, projection):
        # its own keys replace their earlier values, bit_exact holds for both.
        earlier = json.load(open(a.out))
        for key in [k for k in earlier if k.startswith("stripes") or k in ("shaping", "iperf")]:
            del earlier[key]
        result["bit_exact"] = result["bit_exact"] and earlier.get("bit_exact", True)
        earlier.update(result)
        result = earlier
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {a.out}")
    return 0 if result["bit_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
