# Session 60 (DIAGNOSTIC): medians of the timeline that docs/experiments/2026-11-28-narrow-fp8-prologue-timeline.patch prints.
# Usage: python3 this.py TIMELINE_OUTPUT...
import sys, statistics as st
names={0:'entry',1:'wait ret (t0)',2:'length (t0)',3:'CTA barrier',4:'producer done',5:'Q in smem (meet)',6:'tile0 wait',7:'tile1',8:'tile2',9:'tile3',13:'out: P0',10:'out: tile0 products',11:'out: last products',14:'finish recv',12:'partials stored',
32:'t511 length',33:'t511 table',34:'t128 Q first unit',35:'t128 Q last unit',36:'t128 split stored',37:'t511 after start_split_cta',38:'tile0 landed (w13)',39:'t511 reaches wait',40:'t511 passes wait'}
for w in range(16): names[16+w]='warp %d at bar'%w
for f in sys.argv[1:]:
    ev={}; comb={}
    for line in open(f):
        if not line.startswith('call'): continue
        head,vals=line.split(':',1); vals=vals.split()
        tgt = ev if 'split' in head else comb
        for i,v in enumerate(vals):
            if v!='-': tgt.setdefault(i,[]).append(float(v))
    print('==',f)
    order=[0,39,40,1,37,2,32,33,38]+list(range(16,32))+[3,34,35,36,5,6,7,8,9,13,10,11,14,12,4]
    for i in order:
        if i in ev: 
            xs=sorted(ev[i]); print('%-28s n=%5d  p10 %7.3f  med %7.3f  p90 %7.3f'%(names.get(i,i),len(xs),xs[len(xs)//10],st.median(xs),xs[9*len(xs)//10]))
    for i in sorted(comb):
        xs=sorted(comb[i]); print('combine ev%-2d n=%5d  med %7.3f'%(i,len(xs),st.median(xs)))
