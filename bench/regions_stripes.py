#!/usr/bin/env python3
"""The striped runs of scripts/bench-regions (`--stripes 1,N`), for bench/regions_report.py:
each publish against its wire bound with where its time went per region (`stages`), the
measured upload per node against the plan's shares, the speedups over S = 1 beside the
issue's target (0.7 x S), the iperf3 reference of what one flow gets, and the striped 1T
projection under the caps stated. Standard library only."""
import glob
import json
import os

from regions_report import REGIONS, measure_publish


def uploads(path):
    """Bytes each host's veth had carried out (its upload) at a snapshot."""
    out = {}
    for line in open(path):
        parts = line.split()
        if parts[0] == "up" and len(parts) == 3:
            out[parts[1]] = int(parts[2])
    return out


# Stated caps of the striped 1T projection (assumptions, not measured): one
# cross-region TCP flow as clouds cap it, a node's egress across regions, a region
# pair's capacity, and how many inference regions each stripe's root serves.
PROJECTION_FLOW_BPS = 5e9
PROJECTION_NODE_BPS = 25e9
PROJECTION_REGION_BPS = 100e9
PROJECTION_REGIONS = 3


def projected_wire(delta_bits, S, fed):
    """Seconds on the wire of one refit under the stated caps, and which cap binds:
    each of the S stripes crosses into each region as one flow (S x the flow cap),
    each root sends its 1/S to every region through its node's egress, the region
    pair carries it all, and with `fed` (sender hosts, as in this benchmark; not
    producers' hosts, which hold their shards) the trainer's node uploads the delta
    once to its senders first."""
    bounds = {"per_flow": delta_bits / (S * PROJECTION_FLOW_BPS),
              "root_node_egress": PROJECTION_REGIONS * delta_bits / (S * PROJECTION_NODE_BPS),
              "region_pair": delta_bits / PROJECTION_REGION_BPS}
    if fed and S > 1:
        bounds["trainer_feeds_senders"] = delta_bits / PROJECTION_NODE_BPS
    binds = max(bounds, key=bounds.get)
    return bounds[binds], binds


def publish_stages(region_times, delta, flows_into, bounds):
    """Where a publish's time went, per region (seconds after the publish call):
    `start` to its first chunk received whole (that chunk's own transfer included: a
    chunk holds whole partition records, up to 4 MiB each, whatever chunk_size says),
    `stream` from first to last chunk (against that region's wire bound, and the rate
    each WAN flow got), `to_last_chunk_over_wire` the call to the last chunk against
    the wire bound, `apply_tail` from the last chunk to PREPARED, `commit` from
    PREPARED to the commit; and `slowest`, those of the region that committed last."""
    out = {}
    for region, t in region_times.items():
        if None in (t.get("first_chunk"), t.get("last_chunk"), t.get("prepared"),
                    t.get("committed")):
            continue
        stream = t["last_chunk"] - t["first_chunk"]
        wire = bounds.get(f"into_{region}")
        flows = flows_into.get(region, 1)
        out[region] = {"start": t["first_chunk"], "stream": stream,
                       "apply_tail": t["prepared"] - t["last_chunk"],
                       "commit": t["committed"] - t["prepared"],
                       "stream_over_wire": stream / wire if wire else None,
                       "to_last_chunk_over_wire": t["last_chunk"] / wire if wire else None,
                       "mbit_per_flow": delta * 8 / stream / flows / 1e6 if stream > 0 else None}
    if out:
        slowest = max(out, key=lambda r: region_times[r]["committed"])
        out["slowest"] = dict(out[slowest], region=slowest)
    return out


def phase_failovers(work, S):
    """Failovers in the S run's logs ("parent P unreachable; failing over to Q"): a
    node served by another parent than the plan's for that phase."""
    out = []
    for path in sorted(glob.glob(os.path.join(work, f"logs-stripes{S}", "*.log"))):
        for line in open(path, errors="replace"):
            if "failing over to" in line:
                out.append(line.split(" ", 2)[2].strip() + " at " + line.split(" ", 1)[0])
    return out


def stripes_report(a):
    """The `stripes` runs (full, fast, context per stripe count S), each against its
    wire bound, with the measured upload per node against the plan's shares; the
    iperf3 reference of what one flow gets; and the striped 1T projection."""
    regions = REGIONS
    wan_bps = {k + 1: m * 1e6 for k, m in enumerate(a.wan_mbit_list)}
    flow_bps = float(a.flow_mbit) * 1e6 if float(a.flow_mbit) > 0 else None
    uplink_bps = float(a.uplink_mbit) * 1e6
    runs, failures = [], []
    lines = open(os.path.join(a.work, "stripes_runs.txt")).read().split("\n") if os.path.exists(
        os.path.join(a.work, "stripes_runs.txt")) else []
    for line in filter(None, lines):
        parts = line.split()
        S = int(parts[0])
        if len(parts) == 2 or parts[-1] == "failed":
            name = parts[2] if len(parts) > 2 else None
            why = ""
            if name and os.path.exists(os.path.join(a.work, name + ".failed")):
                why = open(os.path.join(a.work, name + ".failed")).read().strip()
            elif len(parts) == 2:
                why = open(os.path.join(a.work, f"plan-stripes{S}.err")).read().strip()
            failures.append({"stripes": S, "kind": parts[1] if len(parts) > 2 else None,
                             "failed": why})
            continue
        kind, name = parts[1], parts[2]
        plan = json.load(open(os.path.join(a.work, f"plan-stripes{S}.json")))
        trees = plan["stripes"] if "stripes" in plan else [{"nodes": plan["nodes"]}]
        nodes_by_region, flows_into = {}, {}
        for n in trees[0]["nodes"]:
            if n["role"] == "receiver":
                nodes_by_region.setdefault(n["region"], []).append(n["id"])
        for t in trees:
            for n in t["nodes"]:
                if n["crosses_wan"]:
                    flows_into[n["region"]] = flows_into.get(n["region"], 0) + 1
        run = measure_publish(a.work, name, dict(enumerate(regions)), nodes_by_region,
                              min(wan_bps.values()), logs=f"logs-stripes{S}")
        delta = run["delta_bytes"]
        # The wire bound: the delta over the sum of usable caps into each region (its WAN,
        # its flows x the per-flow cap), out of the trainer's region (its WAN link) and
        # out of the trainer's node (or, with senders, the senders' nodes).
        bounds = {}
        for k, region in enumerate(regions[1:], start=1):
            usable = wan_bps[k]
            if flow_bps:
                usable = min(usable, flows_into.get(region, 1) * flow_bps)
            bounds[f"into_{region}"] = delta * 8 / usable
        bounds["out_of_train"] = delta * 8 * 3 / sum(wan_bps.values())
        roots = {t.get("root", plan["source"]) for t in trees}
        bounds["root_uplinks"] = delta * 8 * 3 / (uplink_bps * len(roots))
        if plan["source"] not in roots:  # sender hosts: the trainer feeds each its stripe
            bounds["trainer_feeds_senders"] = delta * 8 / uplink_bps
        bound = max(bounds.values())
        stages = publish_stages(run["region_times"], delta, flows_into, bounds)
        before = uploads(os.path.join(a.work, name + ".before"))
        after = uploads(os.path.join(a.work, name + ".after"))
        measured_share = {h: (after[h] - before.get(h, 0)) / delta for h in after if delta}
        planned = plan.get("upload_share", {})
        # Control traffic and TCP/TLS framing add a little; a striped plan and a single
        # tree differ by whole stripes (1/S of the delta) per node.
        matches = bool(planned) and all(abs(measured_share.get(h, 0) - v) <= 0.25 + 0.1 * v
                                        for h, v in planned.items())
        wan_total = sum(v["into_region"] for r, v in run["wan_bytes"].items()
                        if r != regions[0])  # into the inference regions
        runs.append({"kind": kind, "stripes": S, "refit_seconds": run["refit_seconds"],
                     "wan_bytes": wan_total, "bit_exact": run.get("bit_exact", False),
                     "committed": run["committed"], "delta_bytes": delta,
                     "wire_bound_seconds": bound, "wire_bounds": bounds,
                     "over_wire_bound": run["refit_seconds"] / bound if bound else None,
                     "wan_flows_into_region": flows_into,
                     "plan_predicted_seconds_1GiB": plan.get("predicted_seconds"),
                     "upload_share_measured": {h: round(v, 3) for h, v in
                                               sorted(measured_share.items())},
                     "upload_share_planned": planned, "upload_matches_plan": matches,
                     "wan_bytes_by_region": run["wan_bytes"], "region_times": run["region_times"],
                     "stages": stages, "cpu_seconds": run["cpu_seconds"],
                     "failovers_in_phase": phase_failovers(a.work, S)})
    iperf = {}
    for path in sorted(glob.glob(os.path.join(a.work, "iperf-*.json"))):
        streams = int(os.path.basename(path)[6:-5])
        try:
            j = json.load(open(path))
            iperf[f"{streams}_streams_mbit"] = j["end"]["sum_received"]["bits_per_second"] / 1e6
        except (ValueError, KeyError):
            iperf[f"{streams}_streams_mbit"] = None
    if iperf:
        iperf["path"] = (f"trainer -> {regions[1]}1, routed across the {regions[1]} WAN link "
                         "(no proxy), iperf3 -t 4 -O 1")
        iperf["flow_cap_mbit"] = float(a.flow_mbit) or None
        iperf["region_cap_mbit"] = a.wan_mbit_list[0]
        one = iperf.get("1_streams_mbit")
        iperf["flow_cap_binds"] = bool(one and flow_bps and one <= 1.1 * flow_bps / 1e6 and
                                       a.wan_mbit_list[0] > 1.5 * flow_bps / 1e6)
    by = {(r["stripes"], r["kind"]): r for r in runs}
    counts = sorted({r["stripes"] for r in runs})
    speedups = {}
    if len(counts) > 1 and counts[0] == 1:
        for S in counts[1:]:
            for kind in ("full", "fast", "context"):
                if (1, kind) in by and (S, kind) in by:
                    speedups[f"{kind}_S{S}_over_S1"] = (by[(1, kind)]["refit_seconds"] /
                                                        by[(S, kind)]["refit_seconds"])
                    # The part the caps act on alone: the slowest region's stream.
                    one = by[(1, kind)]["stages"].get("slowest", {}).get("stream")
                    many = by[(S, kind)]["stages"].get("slowest", {}).get("stream")
                    if one and many:
                        speedups[f"{kind}_S{S}_over_S1_stream"] = one / many
                    speedups[f"{kind}_S{S}_target"] = 0.7 * S
    projection = None
    base = [by[(1, k)] for k in ("full", "fast", "context") if (1, k) in by]
    if len(base) >= 2:
        # refit = fixed + stream x wire bound, fitted to the S = 1 runs (as tree_report
        # fits the tree's): `fixed` is latency and process work, `stream` how far above
        # the wire the capped flows stream.
        points = [(r["wire_bound_seconds"], r["refit_seconds"]) for r in base]
        mx = sum(x for x, _ in points) / len(points)
        my = sum(y for _, y in points) / len(points)
        stream = (sum((x - mx) * (y - my) for x, y in points) /
                  max(sum((x - mx) ** 2 for x, _ in points), 1e-12))
        fixed = max(my - stream * mx, 0.0)
        params = float(a.params.rstrip("MBG")) * {"M": 1e6, "B": 1e9, "G": 1e9}.get(a.params[-1], 1)
        bpp = by[(1, "fast")]["delta_bytes"] / params if (1, "fast") in by else None
        rows = []
        for S in sorted(set(counts) | {1, 2, 4, 8}):
            for fed in (True, False):
                if not bpp or (S == 1 and not fed):
                    continue
                wire, binds = projected_wire(bpp * 1e12 * 8, S, fed)
                rows.append({"model": "1T", "stripes": S,
                             "roots": "sender hosts fed by the trainer" if fed and S > 1 else
                             "the trainer" if S == 1 else "producers' hosts (no feed)",
                             "wire_seconds": wire, "binding_cap": binds,
                             "seconds": fixed + stream * wire,
                             "wire_speedup_over_S1": None})
        one = next((r["wire_seconds"] for r in rows if r["stripes"] == 1), None)
        for r in rows:
            r["wire_speedup_over_S1"] = one / r["wire_seconds"] if one else None
        projection = {
            "label": "projection: a 1T model's 3 % fast delta (this run's bytes per parameter) "
                     "from one trainer region to 3 inference regions with the caps stated; "
                     "wire = the largest of delta / (S x per-flow cap), 3 x delta / (S x node "
                     "egress) at each stripe's root, delta / region pair, and with sender hosts "
                     "delta / node egress for the trainer's feed; seconds = fixed + stream x "
                     "wire, fitted to this run's S = 1 publishes (assumes S stripes stream as "
                     "one does and that the fixed part, start + apply + commit, does not grow)",
            "caps_stated": {"flow_bps": PROJECTION_FLOW_BPS, "node_egress_bps": PROJECTION_NODE_BPS,
                            "region_pair_bps": PROJECTION_REGION_BPS,
                            "inference_regions": PROJECTION_REGIONS},
            "fit": {"fixed_seconds": fixed, "stream_factor": stream, "points": points},
            "bytes_per_param": bpp, "rows": rows}
    shaping = {"uplink_mbit": float(a.uplink_mbit), "flow_mbit": float(a.flow_mbit) or None,
               "wan_mbit": a.wan_mbit_list, "gateways_per_region": int(a.gateways),
               "senders": int(a.senders),
               "node_egress": "tbf at uplink_mbit on the egress of each node's veth",
               "per_flow": "htb at the region's rate over 256 leaf classes of ceil flow_mbit, by "
                           "the low byte of the flow's ephemeral TCP port (no fq in this kernel)"
                           if float(a.flow_mbit) > 0 else None}
    for r in runs:
        print(f"stripes {r['stripes']} {r['kind']:>7}: {r['refit_seconds']:.2f} s "
              f"(wire bound {r['wire_bound_seconds']:.2f} s, x{r['over_wire_bound']:.2f}), WAN "
              f"{r['wan_bytes']} B, bit_exact={r['bit_exact']}, upload as planned="
              f"{r['upload_matches_plan']}")
        st = r["stages"].get("slowest")
        if st:
            print(f"    slowest region {st['region']}: start {st['start']:.2f} s, stream "
                  f"{st['stream']:.2f} s (x{st['stream_over_wire']:.2f} its wire bound, "
                  f"{st['mbit_per_flow']:.1f} Mbit/s per flow), apply tail "
                  f"{st['apply_tail']:.2f} s, commit {st['commit']:.2f} s")
    for f in failures:
        print(f"stripes {f['stripes']} {f['kind']}: FAILED: {f['failed']}")
    if iperf:
        print(f"iperf3: {iperf}")
    machine = {"cores": os.cpu_count()}
    for when in ("start", "end"):  # the load others put on this shared machine
        path = os.path.join(a.work, f"loadavg.{when}")
        if os.path.exists(path):
            machine[f"loadavg_{when}"] = [float(x) for x in open(path).read().split()[:3]]
    return {"stripes": runs, "stripes_failed": failures, "stripes_speedups": speedups,
            "shaping": shaping, "iperf": iperf, "stripes_projection": projection,
            "stripes_machine": machine}
