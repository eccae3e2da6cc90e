# One-off generator of the project's persona set (committed as JSON); seeded and reproducible.
import json
import random
rng = random.Random(20261129)
sexes = ["Female", "Male"]
races = ["White", "Black", "Asian", "Hispanic", "Other"]
edus = ["High school", "Less than four-year college", "Four-year college", "Postgraduate"]
marital = ["Married", "Unmarried"]
employment = ["Employed for wages", "Self-employed", "Student", "Retired", "Out of work", "Homemaker"]
religions = ["Catholic", "Protestant", "Atheist", "Agnostic", "Jewish", "Muslim", "Other religion",
             "Nothing in particular"]
ideology = ["Liberal", "Moderate", "Conservative"]
names = ["Avery","Blake","Carmen","Dmitri","Elena","Farid","Grace","Hiro","Imani","Jonas","Keira","Luis","Maya",
         "Nikhil","Olga","Pedro","Quinn","Rosa","Samir","Tessa","Umar","Vera","Wes","Xin","Yara","Zane","Aisha",
         "Bruno","Chloe","Dev","Esme","Felix","Gwen","Hassan","Ines","Jack"]
def r(lo, hi, step=0.2):
    n = int(round((hi - lo) / step))
    return round(lo + step * rng.randint(0, n), 2)
out = []
for i, name in enumerate(names):
    p = {"user_id": f"scope_{i+1:03d}", "name": name,
         "extrovert": r(1,5), "agreeable": r(1,5), "conscientious": r(1,5), "neurotic": r(1,5), "open": r(1,5),
         "care": r(1,6,0.25), "fairness": r(1,6,0.25), "loyalty": r(1,6,0.25), "authority": r(1,6,0.25),
         "purity": r(1,6,0.25),
         "freedom": r(1,6,1), "conform": r(1,6,1), "tradition": r(1,6,1), "benevolence": r(1,6,1),
         "universalism": r(1,6,1),
         "self_direction": r(1,6,1), "stimulation": r(1,6,1), "hedonism": r(1,6,1), "achievement": r(1,6,1),
         "power": r(1,6,1),
         "security": r(1,6,1), "rational": r(1,5,0.5), "intuitive": r(1,5,0.5),
         "age": rng.randint(19, 74), "sex": rng.choice(sexes), "race": rng.choice(races), "edu": rng.choice(edus),
         "marital": rng.choice(marital), "employment": rng.choice(employment), "income": rng.randint(1, 12),
         "religion": rng.choice(religions), "ideology": rng.choice(ideology)}
    out.append(p)
json.dump(out, open("scope/envs/data/p4g_personas.json", "w"), indent=1)
print(len(out))
