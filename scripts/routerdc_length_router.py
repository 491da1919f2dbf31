"""Does question length carry within-family routing signal on the RouterDC files? Per family, route each length
quantile bucket (2, 3 or 4 buckets) to its best worker on the train file, and score that on the test file beside
family routing. Scores are read as recorded (the reading of 2026-11-26 02:49, before
docs/decisions/007-routerdc-score-reading.md).
    python scripts/routerdc_length_router.py
Reads the RouterDC files from the data lookup (`python -m launch.data fetch routerdc`); seconds. Used by
docs/log/2026-11-26-replay-attention-and-length.md.
"""

import numpy as np

from routerdc_files import FAMILIES, records, scores

for train, test in FAMILIES:
    a, b = records(train), records(test)
    A, B = scores(a), scores(b)
    train_lengths = np.array([len(r["question"]) for r in a])
    test_lengths = np.array([len(r["question"]) for r in b])
    for buckets in (2, 3, 4):
        edges = np.quantile(train_lengths, np.linspace(0, 1, buckets + 1)[1:-1])
        choice = [A[np.searchsorted(edges, train_lengths) == k].mean(0).argmax() for k in range(buckets)]
        accuracy = np.mean([B[i, choice[k]] for i, k in enumerate(np.searchsorted(edges, test_lengths))])
        print(test, buckets, "buckets", round(100 * accuracy, 2))
    print(test, "family", round(100 * B[:, A.mean(0).argmax()].mean(), 2))
