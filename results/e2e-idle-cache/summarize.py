import json, sys, re, os
O = sys.argv[1]
def stat(path):
    pf = tc = None
    for line in open(path):
        m = re.match(r'\s*([\d,]+)\s+page-faults', line)
        if m: pf = int(m.group(1).replace(',', ''))
        m = re.match(r'\s*([\d.,]+)\s+msec task-clock', line)
        if m: tc = float(m.group(1).replace(',', '')) / 1000
    return pf, tc
for env in ['geo', 'lan']:
    print(f'\n{env}')
    print('| run | cache | backend | job_s | CPU s | clients CPU s | server CPU s | router CPU s | client peak RSS GB | server peak RSS GB | page faults (whole run) |')
    print('|---|---|---|---|---|---|---|---|---|---|---|')
    for i in (1, 2):
        for tag in ('off', 'on'):
            d = f'{O}/{env}-{tag}-{i}'
            if not os.path.exists(d + '/e2e.json'): continue
            pf, tc = stat(d + '.perfstat')
            e = json.load(open(d + '/e2e.json'))
            for r in e['runs']:
                c = r['cpu']
                print(f"| {i} | {tag} | {r['backend']} | {r['rounds_s']:.2f} | {c['total_s']:.1f} | {c['clients_s']:.1f} | {c['server_s']:.1f} | {c['router_s']:.1f} | {c['client_max_rss_bytes']/1e9:.2f} | {c['server_max_rss_bytes']/1e9:.2f} | {pf:,} |")
