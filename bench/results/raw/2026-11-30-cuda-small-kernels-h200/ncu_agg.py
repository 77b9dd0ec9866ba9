import csv,collections,sys
rows=list(csv.reader(open(sys.argv[1])))
hi=[i for i,r in enumerate(rows) if r and r[0]=='ID'][0]
h=rows[hi]
data=[dict(zip(h,r)) for r in rows[hi+1:] if len(r)==len(h)]
def nm(d): return d['Kernel Name'].split('(')[0]
b=len(data)
for i,d in enumerate(data):
    if '4096' in d['Grid Size'] or 'part_l' in d['Kernel Name'] or '262144' in d['Grid Size']:
        b=i;break
for name,seg in (('decode step, batch 1',data[:b]),('prefill chunk, 4096 tokens',data[b:])):
    agg=collections.OrderedDict()
    for d in seg:
        k=nm(d); v=float(d['Metric Value'].replace(',',''))/1000
        a=agg.setdefault(k,[0,0.0,set()]); a[0]+=1;a[1]+=v;a[2].add(d['Grid Size'])
    print('==',name+':', len(seg),'kernels of these names,', '%.1f us'%sum(a[1] for a in agg.values()))
    for k,a in sorted(agg.items(),key=lambda x:-x[1][1]):
        print('%-28s %4d calls %10.1f us  %8.2f us/call  grids %s'%(k,a[0],a[1],a[1]/a[0],' '.join(sorted(a[2])[:4])))
