"""The docs/results.md table of an `mmk-lab simulate` sweep (`--output json`): per interval
and policy the means over seeds of average JCT, JCT / makespan / STP against MIGER, SLO
miss, each class's JCT, the offline p95 slowdown and the share of jobs slowed over 10x.

Usage: python3 tables.py SWEEP.json [POLICY,POLICY,...]
"""
import json,sys,statistics as st
d=json.load(open(sys.argv[1]))
pols=sys.argv[2].split(',') if len(sys.argv)>2 else None
by={}
for r in d['runs']:
    for p in r['policies']:
        by.setdefault((r['interval_s'],p['policy']),[]).append(p)
rowsd={(r['interval_s'],r['policy']):r for r in d['rows']}
def m(v): return st.mean(v)
print("| interval | policy | avg JCT | JCT | makespan | STP | SLO miss | online JCT | offline JCT | offline p95 slowdown | slowed > 10x |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
last=None
for (iv,pol),ps in sorted(by.items(), key=lambda x:(x[0][0], ['default','mps','miso','miger','mmk','mmk-ks'].index(x[0][1]) if x[0][1] in ['default','mps','miso','miger','mmk','mmk-ks'] else 9)):
    if pols and pol not in pols: continue
    r=rowsd[(iv,pol)]
    f=lambda k: r[k]['mean'] if isinstance(r[k],dict) else r[k]
    pct=lambda v: "0" if abs(v)<1e-9 else ("%+.1f %%"%v).replace('-','−')
    name="**mmk**" if pol=="mmk" else pol
    print(f"| {'%g s'%iv if iv!=last else ''} | {name} | {m([p['avg_jct_s'] for p in ps]):,.0f} s | {pct(f('jct_vs_miger_pct'))} | {pct(f('makespan_vs_miger_pct'))} | {pct(f('stp_vs_miger_pct'))} | {f('slo_miss_pct'):.1f} % | {m([p['online_avg_jct_s'] for p in ps]):,.0f} s | {m([p['offline_avg_jct_s'] for p in ps]):,.0f} s | {m([p['offline_p95_slowdown'] for p in ps]):.1f}x | {m([p['slowed_10x_pct'] for p in ps]):.1f} % |")
    last=iv
