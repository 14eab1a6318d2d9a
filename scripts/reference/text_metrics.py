"""Reference for examples/src/{sacrebleu,rouge,porter}.rs: the metrics of upstream's
run_translation.py (`evaluate.load("sacrebleu")`) and run_summarization.py
(`evaluate.load("rouge")` with `use_stemmer=True`), computed by the libraries those wrappers
call: sacrebleu 2.6.0 and rouge-score 0.1.2 (with nltk's PorterStemmer).

Usage: python text_metrics.py OUT_DIR
Writes OUT_DIR/text_metrics.json:
  versions                  sacrebleu, rouge_score, nltk, numpy
  pairs                     [[prediction, reference], ...]: varied sentence pairs (punctuation,
                            numbers, `&quot;` escapes, hyphens, unicode and Python-only
                            whitespace, empty strings, repeated words, multi-line summaries)
  tokenize_13a              [[line, Tokenizer13a()(line)], ...] for every string of `pairs`
  bleu_corpus               sacrebleu.corpus_bleu(preds, [refs]) over all pairs with
                            evaluate's options (smooth_method="exp", smooth_value=None,
                            force=False, lowercase=False, tokenize="13a",
                            use_effective_order=False): score, counts, totals, precisions,
                            bp, sys_len, ref_len (as evaluate returns them)
  bleu_single               the same for each pair alone (a one-sentence corpus)
  bleu_multi                {"hypotheses", "references" (one list per hypothesis),
                            "result"}: several references per hypothesis (evaluate's
                            `references=[[r1, r2], ...]`, transposed into streams)
  rouge_tokens              [[text, DefaultTokenizer(use_stemmer=True).tokenize(text)], ...]
  rouge_pairs               per pair: RougeScorer(["rouge1", "rouge2", "rougeL",
                            "rougeLsum"], use_stemmer=True).score(reference, prediction),
                            {key: [precision, recall, fmeasure]}
  rouge_mean                np.mean of each key's fmeasures over the pairs (evaluate's
                            use_aggregator=False, then the mean)
  rouge_bootstrap_mid       evaluate's default (BootstrapAggregator().aggregate()[k].mid
                            .fmeasure) after np.random.seed(0): informational only
  rouge_multi               scorer.score_multi(references, prediction) for a few cases
  wer_words                 [[text, jiwer.wer_default(text)], ...]: the words WER compares
  wer_pairs                 per pair: [S + D + I, S + D + H] of jiwer.process_words(reference,
                            prediction)
  wer_corpus                evaluate's `wer` over every pair (errors summed / reference words)
  porter                    [[word, PorterStemmer().stem(word)], ...] (mode NLTK_EXTENSIONS)
"""

import json
import sys
from pathlib import Path

import nltk
import numpy as np
import rouge_score
import sacrebleu
from nltk.stem.porter import PorterStemmer
from rouge_score import rouge_scorer, scoring, tokenizers
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

OUT = Path(sys.argv[1])
OUT.mkdir(parents=True, exist_ok=True)

# (prediction, reference)
PAIRS = [
    ("The cat sat on the mat.", "The cat is sitting on the mat."),
    ("There is a cat on the mat.", "The cat sat on the mat."),
    ("It costs $3.50, or 1,000 yen (roughly).", "It costs $3.50 -- about 1,000 yen."),
    ("He said &quot;hello&quot; &amp; left.", 'He said "hello" & left.'),
    ("5 &lt; 7 &gt; 2 and a&b", "5 < 7 > 2 and a & b"),
    ("The U.S. economy grew 2.5% in 2019-2020.", "The US economy grew by 2.5 % in 2019 - 2020."),
    ("state-of-the-art models, e.g., transformers.", "state of the art models e.g. transformers"),
    ("", "An empty hypothesis scores nothing."),
    ("A prediction with an empty reference.", ""),
    ("", ""),
    ("the the the the the the the", "The cat is on the mat."),
    ("Running runners ran; they were running quickly.", "The runner runs and has run."),
    ("Generalization of conditional relational models, hopefully.",
     "Hopefully, the relational and conditional generalizations agree."),
    ("The ponies caresses agreed happily in the sky.", "Pony caressed, agreeing, happy sky!"),
    ("Café naïve résumé — façade «quotes» and “curly” ‘ones’.",
     "Cafe naive resume - facade \"quotes\" and \"curly\" 'ones'."),
    ("Tabs\tand  double  spaces\u00a0and\u2003em spaces.", "Tabs and double spaces and em spaces."),
    ("Separators\x1cinside\x1fwords", "Separators inside words"),
    ("Trailing whitespace   \t ", "Trailing whitespace"),
    ("Line one.\nLine two is here.\nLine three ends.", "Line one.\nLine two is there.\nThe end."),
    ("First sentence about cats.\nSecond sentence about dogs.",
     "Dogs are discussed second.\nCats come first in this summary.\nA third line."),
    ("Hyphen-\nated across lines.", "Hyphenated across lines."),
    ("This was <skipped> removed.", "This was removed."),
    ("Numbers: 3.14159, 2,718 and -5.", "Numbers : 3.14159 , 2,718 and -5 ."),
    ("Dots... and commas,, everywhere.,", "Dots . . . and commas , , everywhere . ,"),
    ("a.b,c 1.a a.1 1,2 x-1 1-x 9-", "a . b , c"),
    ("Brackets [x] {y} (z) <w> ~tilde~ `tick` ^caret^ _under_ |pipe| \\back\\",
     "Brackets x y z w tilde tick caret under pipe back"),
    ("Math: a+b=c; d*e/f? g@h! #tag %pct",
     "Math : a + b = c ; d * e / f ? g @ h ! # tag % pct"),
    ("It's John's book, isn't it?", "It is John's book, is it not?"),
    ("The quick brown fox jumps over the lazy dog.",
     "The quick brown dog jumps on the log."),
    ("Officials said the generalizations were conditional upon relational agreements.",
     "The officials agreed that generalization is conditional on relations."),
    ("The universities' universal university universally universalized.",
     "Universally, universities universalize."),
    ("Dying tying lying skies innings outings cannings news.",
     "Die tie lie sky inning outing canning news."),
    ("Electrical electricity electrician electrically.", "Electric electrics."),
    ("2019 was the year; 2020 was the other year; 2021.", "2019 and 2020 and 2021 were years."),
    ("ALL CAPS SHOUTING HERE", "all caps shouting here"),
    ("Repeated repeated repeated words words.", "Repeated words."),
    ("Ὀδυσσεύς ΟΔΟΣ straße İstanbul KELVIN\u212a", "odysseus odos strasse istanbul kelvin k"),
    ("中文 测试 句子 。", "中文 测试 的 句子 。"),
    ("A longer prediction that keeps going and going well past the length of the "
     "reference so that the brevity penalty is one.", "A short reference."),
    ("Short.", "A much longer reference sentence so that the brevity penalty applies strongly."),
    ("yyyy syzygy toy toys enjoying enjoyment", "yyyy syzygi toi toys enjoy enjoyment"),
    ("Multi-line\n\nwith blank lines\n\n\nand more", "multi line\nwith blank lines\nand more"),
    ("A dog.", "A dog is here."),
    ("Yes", "Yes"),
    ("Yes no", "No yes"),
]

PORTER_WORDS = """
caresses ponies ties caress cats feed agreed plastered bled motoring sing conflated troubled
sized hopping tanned falling hissing fizzed failing filing happy sky relational conditional
rational valenci hesitanci digitizer conformabli radicalli differentli vileli analogousli
vietnamization predication operator feudalism decisiveness hopefulness callousness formaliti
sensitiviti sensibiliti triplicate formative formalize electriciti electrical hopeful goodness
revival allowance inference airliner gyroscopic adjustable defensible irritant replacement
adjustment dependent adoption homologou communism activate angulariti homologous effective
bowdlerize probate rate cease controll roll running generalization generalizations hopefully
agreeing agreement agree universal university universities universally universalized
universalize dying tying lying skies innings inning outings outing cannings canning news howe
proceed exceed succeed proceeding exceeded succeeding die lie tie dies lies died lied tied
spied tried flies spy fly try enjoy enjoyment enjoying toy toys syzygy yyyy y yy yyy ay
by boy say says saying sayings playing played player players plays employ employee employer
abilities ability able ably abolition absolutely absorbing abundance academic academy
acceptance accessible accidentally accommodation accompanied according accountability
achievement acknowledgement acquisition activities actually adaptation additional addresses
administration admiration adventurous advertisement affectionate affordable aggressively
alleged allegedly alliance allied allies allocation alternatively ambiguity amusement
analyses analysis analytical ancestors animation announcement annually anticipation
anxiously apologize apparently appearance appliance applicable application appreciation
approximately archaeological argument arrangement articulated artificial assassination
assumption atmosphere attachment attention attractiveness authoritative automatically
availability awareness backgrounds bakeries bakery balloon banking bankruptcy beautifully
beginning behavioural believable belonging beneficial bewildered biological blessing
boundaries breathtaking brightness broadcasting brotherhood bureaucratic businesses
calculation calmly capabilities capitalism carefully carelessness categorization celebration
certainly challenging championship characterization cheerfully childhood circulation
civilization classification cleverness clinically coincidentally collaboration colonial
comfortable commercially commitment committee communication communities comparatively
competitiveness complication comprehensive compromising computational concentration
conclusively conditionally confidentiality confrontation congratulations consciousness
consequently considerably consistency conspiracy constitutional consultation contamination
contemporary continuously contradiction controversial convenience conversational
cooperation coordination corresponding counterproductive courageous craziness creativity
criminalization critically cultivation curiosity customizable dangerously decentralization
decisively declaration definitely deliberately democratization demonstration dependency
depressingly describable desirability destruction determination developmental dictatorship
differentiation digitalization diplomatically disagreement disappointment discrimination
disorganized distinguishable documentation domestically dramatically ecologically
economically educational effectiveness efficiently electrification elimination
embarrassment emotionally emphasize employability encouragement endangered enforcement
enlightenment enthusiastically entitlement environmentally equalization establishment
evaluation eventually exaggeration examination exceptionally excitement exclusively
existentialism expectation experimentation explanation exploitation extraordinarily
fabrication facilitation faithfully familiarization fascination federalism feelings
fictionalization flexibility fluently forgiveness formalization fortunately fragmentation
friendliness fulfillment functionality fundamentally generously globalization gracefully
gratefully guaranteeing hallucination happiness harmonization hesitation historically
hospitalization humanitarianism humiliation hypothetically identification illumination
imagination immediately implementation impossibility improvisation inclusiveness
incorporation independently individualization industrialization inevitably information
initialization innovation inspirational institutionalization instrumentation
intellectually intentionally internationalization interpretation intimidation
investigation irresponsibility justification knowledgeable legalization legitimately
liberalization localization magnificently maintenance manipulation marginalization
mathematically meaningfully mechanization memorization militarization miscommunication
modernization monopolization motivational multiplication nationalization naturally
negotiation neighbourhood neutralization normalization notification obligation observation
occasionally operationally optimization organizational orientation overwhelmingly
participation particularly passionately performance personalization persuasion philosophical
photosynthesis polarization politically popularization possibility practically precipitation
predictability preferably preparation presentation prioritization privatization
probabilistic procrastination productivity professionalism programmatically proportionally
prosecution psychologically publication qualification questionable rationalization
realization reasonably recommendation reconciliation regionalization regulation
relationship relativity reliability remarkably representation reproducibility responsibility
revolutionary romanticization sanitization satisfaction scientifically secularization
sensationalism sensitization sentimentality significantly simplification simultaneously
socialization sophistication specialization spectacularly spirituality stabilization
standardization sterilization strategically subordination substantially successfully
sufficiently summarization supposedly surprisingly sustainability symbolization
synchronization systematically technological temporarily theoretically thoughtfully
traditionally transformation transportation tremendously unbelievably uncomfortable
understandably unfortunately unquestionably urbanization utilization validation
verification visualization vocationally vulnerability westernization wholeheartedly
wonderfully worthiness yellowish yelling youthfulness zealously zigzagging
logi logical biology analogies apologies apology fulli carefulli hopefulli
alli realli finalli ally rally tally generally totally equally
ies ied ties died pies skied shied eyed dyed
sses ss s ing ed eed bed red need seed speed breed agreed freed
at bl iz hoping hopped hopes hoped coping copied copies
filing filed tanning tanned hissing fizzing fizzled
ational tional iveness abli bli ousli entli eli
2019s 1990s 3d mp3s covid19 a1b2c3 abc123ing running2 x86 ipv6
a an is as us go me my of on to up we
sky's ok okay hello helloing worlds wording crying cried cries
flying flies fried frying buying bought selling sold telling told
maximum minimum criterion criteria phenomena phenomenon datum data
indices index matrices matrix vertices vertex analyses theses
Running CARESSES Generalization MiXeD
café naïve résumé straße ΟΔΟΣ İstanbul
""".split()

stemmer = PorterStemmer()
porter = [[w, stemmer.stem(w)] for w in PORTER_WORDS]

tok13a = Tokenizer13a()
strings = [s for pair in PAIRS for s in pair]
tokenize_13a = [[s, tok13a(s)] for s in strings]


def bleu(hyps, refs_streams):
    out = sacrebleu.corpus_bleu(
        hyps,
        refs_streams,
        smooth_method="exp",
        smooth_value=None,
        force=False,
        lowercase=False,
        tokenize="13a",
        use_effective_order=False,
    )
    return {
        "score": out.score,
        "counts": out.counts,
        "totals": out.totals,
        "precisions": out.precisions,
        "bp": out.bp,
        "sys_len": out.sys_len,
        "ref_len": out.ref_len,
    }


preds = [p for p, _ in PAIRS]
refs = [r for _, r in PAIRS]
bleu_corpus = bleu(preds, [refs])
bleu_single = [bleu([p], [[r]]) for p, r in PAIRS]

multi_hyps = [
    "The cat sat on the mat.",
    "It is raining cats and dogs today.",
    "A quick brown fox.",
    "He said &quot;no&quot;.",
]
multi_refs = [
    ["The cat is on the mat.", "There is a cat sitting on the mat."],
    ["It rains heavily today.", "Today it is raining cats and dogs!"],
    ["The quick brown fox jumps.", "A fast brown fox."],
    ['He said "no".', "He refused."],
]
bleu_multi = {
    "hypotheses": multi_hyps,
    "references": multi_refs,
    # evaluate's transposition: one stream per reference position.
    "result": bleu(multi_hyps, [[r[i] for r in multi_refs] for i in range(2)]),
}

KEYS = ["rouge1", "rouge2", "rougeL", "rougeLsum"]
scorer = rouge_scorer.RougeScorer(KEYS, use_stemmer=True)
tok = tokenizers.DefaultTokenizer(use_stemmer=True)
rouge_tokens = [[s, tok.tokenize(s)] for s in strings]
scores = [scorer.score(r, p) for p, r in PAIRS]
rouge_pairs = [{k: [float(x) for x in s[k]] for k in KEYS} for s in scores]
rouge_mean = {k: float(np.mean([s[k].fmeasure for s in scores])) for k in KEYS}
np.random.seed(0)
agg = scoring.BootstrapAggregator()
for s in scores:
    agg.add_scores(s)
agg = agg.aggregate()
rouge_bootstrap_mid = {k: float(agg[k].mid.fmeasure) for k in KEYS}
rouge_multi = []
for pred, targets in [
    ("The cat sat on the mat.", ["A dog.", "The cat is on the mat.", "Cats sat on mats."]),
    ("Nothing in common.", ["Entirely different.", "Also different."]),
    ("Ties pick the first.", ["ties pick the first", "Ties pick the first."]),
]:
    s = scorer.score_multi(targets, pred)
    rouge_multi.append(
        {
            "prediction": pred,
            "references": targets,
            "scores": {k: [float(x) for x in s[k]] for k in KEYS},
        }
    )

# evaluate's `wer` (wer.py over jiwer 4's process_words): each pair's words (jiwer's
# wer_default) and counts, and the ratio over the pairs with a non-empty reference.
import jiwer

wer_words = [[x, jiwer.wer_default(x)[0] if jiwer.wer_default(x) else []] for x in strings]
wer_pairs = []
incorrect = total = 0
for p, r in PAIRS:
    m = jiwer.process_words(r, p)
    wer_pairs.append([m.substitutions + m.deletions + m.insertions, m.substitutions + m.deletions + m.hits])
    incorrect += wer_pairs[-1][0]
    total += wer_pairs[-1][1]
wer_corpus = incorrect / total

(OUT / "text_metrics.json").write_text(
    json.dumps(
        {
            "versions": {
                "sacrebleu": sacrebleu.__version__,
                "rouge_score": getattr(rouge_score, "__version__", "0.1.2"),
                "nltk": nltk.__version__,
                "numpy": np.__version__,
            },
            "pairs": [list(p) for p in PAIRS],
            "tokenize_13a": tokenize_13a,
            "bleu_corpus": bleu_corpus,
            "bleu_single": bleu_single,
            "bleu_multi": bleu_multi,
            "rouge_tokens": rouge_tokens,
            "rouge_pairs": rouge_pairs,
            "rouge_mean": rouge_mean,
            "wer_words": wer_words,
            "wer_pairs": wer_pairs,
            "wer_corpus": wer_corpus,
            "rouge_bootstrap_mid": rouge_bootstrap_mid,
            "rouge_multi": rouge_multi,
            "porter": porter,
        },
        ensure_ascii=False,
        indent=1,
    )
)
