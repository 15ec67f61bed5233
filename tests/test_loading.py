"""Models load once per process, whichever threads ask at once (a CLI search asks from one thread per source)."""

import subprocess
import sys
import textwrap

# A fresh process, as a user's first CLI query is: the threads race for the encoder, then the scoring LM loads.
RACE = textwrap.dedent("""
    import threading
    from gradfuse.embedding.encoder import load_encoder
    from gradfuse.rerank import load_scorer
    from gradfuse.rerank.upr import UPRScorer

    start, loaded = threading.Barrier(3), []
    def load():
        start.wait()
        loaded.append(load_encoder("all-MiniLM-L6-v2@float32"))
    threads = [threading.Thread(target=load) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print("encoders", len({id(e) for e in loaded}))
    scorer = load_scorer("smollm2")
    print("meta", sum(p.is_meta for p in scorer.model.parameters()))
    print("scores", len(UPRScorer(scorer).values("Which planet has moons?", ["Mars has two moons.", "Bread rises."])))
""")


def test_concurrent_first_loads_give_one_encoder_and_a_whole_scoring_lm():
    for _ in range(2):  # the race it guards against hit about one fresh process in three
        done = subprocess.run([sys.executable, "-c", RACE], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "encoders 1" in done.stdout and "meta 0" in done.stdout and "scores 2" in done.stdout, done.stdout
