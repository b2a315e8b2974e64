"""DuReader-checklist MRC toolkit on PaddlePaddle: data, vocab, features, models, metric, ensembling."""
