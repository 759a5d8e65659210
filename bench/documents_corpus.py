"""The labelled corpus of ``bench/documents.py``: 12 short documents of distinct topics,
each with specific facts, and 24 questions, each naming the document and a phrase of the
passage that answers it."""

from __future__ import annotations

DOCUMENTS: dict[str, list[str]] = {
    "lighthouse.md": [
        "The Karnby lighthouse stands on the northern cape of Vell Island. It was lit for the "
        "first time in 1873 and its lantern sits 41 metres above the sea.",
        "Its light flashes white twice every fifteen seconds, a pattern sailors call the "
        "Karnby double. In clear weather it can be seen from 22 nautical miles away.",
        "The last resident keeper, Ida Morrow, left in 1964 when the light was automated. "
        "Her logbooks are kept in the island museum.",
        "The tower was painted in red and white bands in 1911 after two ships mistook it for "
        "the lighthouse at Horn Point.",
    ],
    "sourdough.md": [
        "A sourdough starter is a culture of wild yeast and lactic acid bacteria kept in "
        "flour and water. Feed it equal weights of flour and water once a day.",
        "For the house loaf, mix 500 grams of bread flour with 350 grams of water and 100 "
        "grams of active starter, then add 10 grams of salt after a forty minute rest.",
        "Bulk fermentation takes four to six hours at 24 degrees Celsius; fold the dough "
        "every half hour for the first two hours.",
        "Bake in a covered cast iron pot at 250 degrees for twenty minutes, then uncover it "
        "and bake another twenty minutes until the crust is dark.",
    ],
    "heat_pump.md": [
        "The Arden HP-9 heat pump moves heat from outdoor air into the house. Its seasonal "
        "coefficient of performance is 4.1 in a mild climate.",
        "The outdoor unit must stand at least 30 centimetres from any wall so air can flow "
        "freely around the evaporator fins.",
        "In defrost mode the unit reverses for up to eight minutes; steam from the outdoor "
        "unit during defrost is normal and not a fault.",
        "Error code E7 means the refrigerant pressure is low. Switch the unit off and call "
        "a certified technician; do not refill it yourself.",
    ],
    "marathon.md": [
        "The Riverside Marathon starts at 7:30 in the morning on the first Sunday of "
        "October. Runners must collect their bib numbers on Saturday at the town hall.",
        "Water stations are placed every five kilometres, and energy gels are handed out "
        "at kilometre 21 and kilometre 32.",
        "The course closes six hours after the start; runners still on the course after "
        "that are asked to board the sweeper bus.",
        "The course record of 2 hours 9 minutes 44 seconds was set by Tomas Ekberg in 2019.",
    ],
    "tax_note.md": [
        "For the 2025 tax year the personal allowance is 12,570 pounds, and income above it "
        "is taxed at the basic rate of 20 percent up to 50,270 pounds.",
        "Self-assessment returns filed online are due by 31 January; paper returns are due "
        "by 31 October.",
        "Keep receipts for work expenses for at least five years after the filing deadline, "
        "in case the tax office asks to see them.",
        "Interest on savings up to 1,000 pounds is tax free for basic rate taxpayers under "
        "the personal savings allowance.",
    ],
    "octopus.md": [
        "The common octopus has three hearts: two pump blood through the gills and one "
        "through the rest of the body.",
        "Its blood is blue because it carries oxygen with haemocyanin, a copper-based "
        "protein, rather than iron-based haemoglobin.",
        "Two thirds of an octopus's neurons are in its arms, which can taste what they touch "
        "through thousands of suckers.",
        "A female guards her eggs for up to two months without eating and dies soon after "
        "they hatch.",
    ],
    "bicycle.md": [
        "To fix a puncture, remove the wheel, lever the tyre off the rim and pull out the "
        "inner tube. Pump it up and listen for the hiss to find the hole.",
        "Roughen the area around the hole with sandpaper, spread a thin layer of vulcanising "
        "solution and wait until it turns dull before pressing the patch on.",
        "Road tyres usually run at 80 to 100 psi; mountain bike tyres at 25 to 35 psi.",
        "Oil the chain every 300 kilometres, or after every ride in the rain, and wipe off "
        "the excess so it does not collect grit.",
    ],
    "volcano.md": [
        "Mount Heklan is a stratovolcano 1,491 metres high. Its last eruption, in March "
        "2000, lasted eleven days.",
        "Lava from Heklan is mostly andesite, which is thicker than basalt and flows slowly.",
        "The observatory at Selby measures ground swelling with GPS stations and issues a "
        "yellow alert when the summit rises more than 5 centimetres in a month.",
        "Ash from the 1947 eruption fell as far away as Helsinki, 2,000 kilometres to the east.",
    ],
    "chess_club.md": [
        "The Elm Street chess club meets on Tuesday evenings from 7 to 10 in the library "
        "basement. Membership costs 40 euros a year.",
        "The winter tournament uses a time control of 90 minutes plus 30 seconds per move, "
        "over seven rounds of the Swiss system.",
        "Beginners get a free lesson on the first Tuesday of each month with coach Helena Varga.",
        "The club champion of 2024 was Marek Novak, who won with 6 points out of 7.",
    ],
    "coffee.md": [
        "Arabica coffee grows best at altitudes between 1,000 and 2,000 metres, where cool "
        "nights slow the ripening of the cherries.",
        "For a pour-over, use 15 grams of coffee per 250 millilitres of water at 94 degrees, "
        "and let it bloom for 30 seconds.",
        "Robusta beans contain about twice as much caffeine as arabica beans and taste "
        "more bitter.",
        "Green coffee beans keep for a year, but roasted beans are best within a month of "
        "roasting.",
    ],
    "server_manual.md": [
        "To reset the Norv X2 router to factory settings, hold the recessed button on the "
        "back for 12 seconds until the status light blinks amber.",
        "The default admin address is 192.168.8.1 and the default password is printed on the "
        "label under the device.",
        "Firmware updates are checked every night at 3 in the morning; the router restarts "
        "only if an update was installed.",
        "A solid red light means the router has no connection to the internet provider.",
    ],
    "bees.md": [
        "A honey bee colony has one queen, a few hundred drones and up to 60,000 workers in "
        "summer.",
        "Worker bees tell each other where flowers are with the waggle dance: the angle of "
        "the run shows the direction relative to the sun.",
        "A worker lives about six weeks in summer, but workers born in autumn live through "
        "the winter, up to six months.",
        "To make one kilogram of honey, bees visit around four million flowers.",
    ],
}

# (question, document, a phrase of the passage that answers it)
QUESTIONS: list[tuple[str, str, str]] = [
    ("When was the Karnby light first lit?", "lighthouse.md", "1873"),
    ("How often does the lighthouse flash?", "lighthouse.md", "twice every fifteen seconds"),
    ("Who was the last keeper of the lighthouse?", "lighthouse.md", "Ida Morrow"),
    ("How much salt goes into the house loaf?", "sourdough.md", "10 grams of salt"),
    ("At what temperature should the bread be baked?", "sourdough.md", "250 degrees"),
    ("What does error E7 on the heat pump mean?", "heat_pump.md", "E7"),
    ("How far from the wall must the outdoor unit be?", "heat_pump.md", "30 centimetres"),
    ("Is steam from the outdoor unit a problem?", "heat_pump.md", "steam"),
    ("Where do runners pick up their bib numbers?", "marathon.md", "town hall"),
    ("What is the course record of the race?", "marathon.md", "Tomas Ekberg"),
    ("When is the online self-assessment deadline?", "tax_note.md", "31 January"),
    ("How long should I keep receipts for expenses?", "tax_note.md", "five years"),
    ("Why is octopus blood blue?", "octopus.md", "haemocyanin"),
    ("How many hearts does an octopus have?", "octopus.md", "three hearts"),
    ("How do I find the hole in an inner tube?", "bicycle.md", "hiss"),
    ("What pressure should road bike tyres have?", "bicycle.md", "80 to 100 psi"),
    ("When did Mount Heklan last erupt?", "volcano.md", "March"),
    ("When does the observatory issue a yellow alert?", "volcano.md", "yellow alert"),
    ("How much does chess club membership cost?", "chess_club.md", "40 euros"),
    ("Who won the club championship in 2024?", "chess_club.md", "Marek Novak"),
    ("How much coffee should I use for a pour-over?", "coffee.md", "15 grams"),
    ("How do I factory reset the router?", "server_manual.md", "12 seconds"),
    ("What does a solid red light on the router mean?", "server_manual.md", "solid red"),
    ("How do bees tell each other where flowers are?", "bees.md", "waggle dance"),
]
