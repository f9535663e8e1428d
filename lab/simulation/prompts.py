"""Built-in prompts per business line: topics, question templates and slot values.

Templates times slots give thousands of distinct prompts per line, so the loop's
fresh evaluation prompts (another seed) are mostly prompts no night trained on.
Each topic also names the words an on-topic answer uses and the fix a user
who knows the answer would write in an edit.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Topic:
    """One kind of question of a line."""

    name: str
    templates: tuple[str, ...]
    triggers: tuple[str, ...]
    answer_terms: tuple[str, ...]
    fix: str


SLOTS: dict[str, tuple[str, ...]] = {
    "item": (
        "shoes", "jacket", "headphones", "coffee machine", "phone case", "backpack", "desk lamp",
        "blender", "winter coat", "keyboard", "water bottle", "sofa cushion", "watch", "printer",
    ),
    "days": ("three", "four", "five", "six", "seven", "ten"),
    "when": ("last week", "two weeks ago", "on Monday", "yesterday", "last month"),
    "person": ("my son", "my daughter", "my father", "my mother", "my partner", "my friend"),
    "age": ("6", "9", "35", "45", "62", "70"),
    "employer": ("my employer", "my old company", "the restaurant I worked at", "my manager"),
    "amount": ("$300", "$800", "$1,200", "$2,500", "two weeks of pay"),
    "thing": ("photo", "drawing", "song", "blog post", "logo"),
    "tail": (
        "", "", "", " Please be quick.", " What are my options?", " Thanks in advance.",
        " It is urgent.", " I am worried about it.",
    ),
}  # fmt: skip

TOPICS: dict[str, tuple[Topic, ...]] = {
    "customer_service": (
        Topic(
            "late_delivery",
            (
                "My {item} order from {when} has not arrived yet, what should I do?{tail}",
                "The tracking page for my {item} has not changed for {days} days.{tail}",
                "Where is my {item}? I ordered it {when}.{tail}",
            ),
            ("arrived", "tracking", "where is my"),
            ("track", "deliver", "carrier", "courier", "ship", "package", "reship", "order"),
            "Please check the tracking link in your order email; if it has not moved for five "
            "days, reply with your order number and we will reship it for free.",
        ),
        Topic(
            "return",
            (
                "How do I return a {item} that does not fit?{tail}",
                "I want to send back the {item} I bought {when}.{tail}",
                "Can I exchange my {item} for another size?{tail}",
            ),
            ("return", "send back", "exchange"),
            ("return", "label", "exchange", "refund", "send it back", "send back", "size"),
            "Open Orders, choose the item and select Return; we email you a free return label "
            "and refund you once it arrives.",
        ),
        Topic(
            "double_charge",
            (
                "I was charged twice for my {item} order.{tail}",
                "My card shows two payments for the {item} I bought {when}.{tail}",
            ),
            ("charged twice", "two payments"),
            ("charge", "refund", "payment", "bank", "card", "billing", "duplicate"),
            "The second charge is usually a pending hold that drops off within three days; if it "
            "stays, send us the order number and we will refund it.",
        ),
        Topic(
            "address_change",
            (
                "Can I change the delivery address of the {item} I ordered {when}?{tail}",
                "I moved and need my {item} sent to a new address.{tail}",
            ),
            ("address",),
            ("address", "order", "update", "change", "deliver", "ship"),
            "If the order has not shipped, open Orders and edit the address; if it has, contact "
            "us and we will ask the carrier to redirect it.",
        ),
        Topic(
            "coupon",
            (
                "The coupon code does not work when I buy a {item}.{tail}",
                "My discount code for the {item} says it is invalid.{tail}",
            ),
            ("coupon", "discount code"),
            ("coupon", "code", "discount", "checkout", "promo", "expire"),
            "Check that the code has not expired and that the item is not excluded; if it still "
            "fails, send us the code and we will apply the discount by hand.",
        ),
        Topic(
            "password",
            (
                "I forgot my password and the reset email never came.{tail}",
                "I cannot log in to my account to check on my {item}.{tail}",
            ),
            ("password", "log in"),
            ("password", "reset", "email", "spam", "account", "link", "log in", "login"),
            "Check your spam folder for the reset email, then request a new link; if none "
            "arrives in ten minutes, we can verify you and reset it for you.",
        ),
    ),
    "medical": (
        Topic(
            "headache",
            (
                "{person} has had a headache for {days} days, should we worry?{tail}",
                "What helps with a headache that keeps coming back?{tail}",
            ),
            ("headache",),
            ("headache", "pain", "rest", "water", "hydrat", "sleep", "migraine", "relief"),
            "Rest, drink water and use a standard pain reliever as the label says.",
        ),
        Topic(
            "fever",
            (
                "{person} has a fever of 38.5 degrees, what should we do?{tail}",
                "How should I bring down a fever at age {age}?{tail}",
            ),
            ("fever",),
            ("fever", "temperature", "fluid", "rest", "paracetamol", "acetaminophen", "cool"),
            "Keep them drinking fluids, let them rest and use paracetamol as the label says.",
        ),
        Topic(
            "medicine_mix",
            (
                "Can I take ibuprofen together with my blood pressure medication?{tail}",
                "Is it safe to mix allergy pills with my sleeping tablets?{tail}",
            ),
            ("ibuprofen", "mix", "together with"),
            ("interact", "medication", "medicine", "label", "dose", "combine", "mix", "safe"),
            "Some of these medicines interact, so check the leaflet before you combine them.",
        ),
        Topic(
            "sleep",
            (
                "How much sleep does a {age} year old really need?{tail}",
                "{person} cannot fall asleep at night, what can help?{tail}",
            ),
            ("sleep", "asleep"),
            ("sleep", "hours", "bed", "routine", "screen", "caffeine", "night"),
            "Most adults need seven to nine hours; keep a regular bedtime and avoid screens late.",
        ),
        Topic(
            "back_pain",
            (
                "{person} has lower back pain after lifting a box {when}.{tail}",
                "What can I do about back pain from sitting all day?{tail}",
            ),
            ("back pain",),
            ("back", "pain", "stretch", "posture", "rest", "heat", "move", "exercise"),
            "Keep moving gently, use heat on your back and take regular breaks from sitting.",
        ),
        Topic(
            "rash",
            (
                "{person} has a red itchy rash on the arm since {when}.{tail}",
                "What should I put on a skin rash that will not go away?{tail}",
            ),
            ("rash",),
            ("rash", "skin", "itch", "cream", "allerg", "soap", "irritat"),
            "Keep the skin clean and dry, avoid new soaps and try a mild anti-itch cream.",
        ),
    ),
    "legal": (
        Topic(
            "deposit",
            (
                "My landlord will not return my deposit of {amount}.{tail}",
                "I moved out {when} and the landlord kept the whole deposit.{tail}",
            ),
            ("deposit", "landlord"),
            ("deposit", "landlord", "lease", "letter", "demand", "small claims", "tenant"),
            "Write to the landlord asking for the deposit back by a date, keep copies and photos, "
            "then file in small claims court if they do not pay.",
        ),
        Topic(
            "unpaid_wages",
            (
                "{employer} still owes me {amount} in wages.{tail}",
                "I quit {when} and never got my last paycheck.{tail}",
            ),
            ("wages", "paycheck", "owes me"),
            ("wage", "pay", "employer", "labor", "claim", "record", "complaint"),
            "Ask the employer in writing, keep your pay records, then file a wage claim with the "
            "labor department.",
        ),
        Topic(
            "contract",
            (
                "Can I get out of a gym contract I signed {when}?{tail}",
                "A contractor took {amount} and never finished the work.{tail}",
            ),
            ("contract", "contractor"),
            ("contract", "cancel", "terms", "clause", "written", "breach", "notice"),
            "Read the cancellation clause, send written notice and keep proof that you sent it.",
        ),
        Topic(
            "copyright",
            (
                "Someone used my {thing} online without asking.{tail}",
                "Can I use a {thing} I found on the internet for my business?{tail}",
            ),
            ("without asking", "found on the internet"),
            ("copyright", "permission", "license", "takedown", "owner", "credit"),
            "Collect screenshots, ask for removal in writing and send a copyright takedown "
            "notice to the site if they refuse.",
        ),
        Topic(
            "traffic_ticket",
            (
                "I got a speeding ticket {when}, should I fight it?{tail}",
                "{person} got a parking fine that seems wrong.{tail}",
            ),
            ("ticket", "fine"),
            ("ticket", "fine", "court", "contest", "evidence", "photo", "pay", "deadline"),
            "Check the deadline on the notice, collect photos or other evidence and contest it "
            "in writing or in court.",
        ),
        Topic(
            "neighbor_noise",
            (
                "My neighbor plays loud music every night.{tail}",
                "The people upstairs make noise until 3 am.{tail}",
            ),
            ("neighbor", "noise", "upstairs"),
            ("noise", "neighbor", "landlord", "complain", "record", "police", "mediation"),
            "Talk to them first, keep a log of the dates, then complain to the landlord or the "
            "city's noise line.",
        ),
    ),
}


def topics_of(business_line: str) -> tuple[Topic, ...]:
    """The line's topics (a line without its own uses customer service's)."""
    return TOPICS.get(business_line, TOPICS["customer_service"])


def topic_of(business_line: str, prompt: str) -> Topic | None:
    """The topic a prompt is about, by its trigger words (None: not a built-in prompt)."""
    lowered = prompt.lower()
    for topic in topics_of(business_line):
        if any(trigger in lowered for trigger in topic.triggers):
            return topic
    return None


def _fill(template: str, rng: random.Random) -> str:
    values = {name: rng.choice(options) for name, options in SLOTS.items()}
    text = template.format(**values)
    return text[0].upper() + text[1:]


def builtin_prompts(business_line: str, n: int, seed: int) -> list[str]:
    """``n`` prompts of the line, drawn from its templates and slots (same seed, same list)."""
    rng = random.Random(f"{business_line}:{seed}")
    topics = topics_of(business_line)
    prompts = []
    for _ in range(n):
        topic = rng.choice(topics)
        prompts.append(_fill(rng.choice(topic.templates), rng))
    return prompts
