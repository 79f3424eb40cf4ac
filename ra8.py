import wdsx, glob
urls=[f"http://127.0.0.1:18765/t-{i:06d}.tar" for i in range(3)]
loc=sorted(glob.glob("/tmp/review_integ/d2/t-*.tar"))
seq=list(wdsx.WebDataset(loc, shardshuffle=False))
try:
    ds=wdsx.IndexedDataset(urls); print("len", len(ds))
    for i in [0,3,8,20,-1]:
        try:
            r=ds[i]; print(i, r["__key__"], seq[i]["__key__"], r.get("txt")==seq[i].get("txt"))
        except Exception as e: print(i, type(e).__name__, str(e)[:300])
except Exception as e: print("ctor", type(e).__name__, str(e)[:300])
